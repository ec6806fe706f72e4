"""Everything the docs say about the registered studies comes from the committed archives (issue 42 item 5):
the study sections of docs/REPRODUCE.md and the studies table of README.md are regenerated from the plans,
the pilot summaries and docs/studies/STUDY.json.gz without training, and must equal the committed text; and
for every archive, the commit that registered the study's plan precedes the run and the archive in git
history, and the run recorded its commit."""

from __future__ import annotations

import subprocess

import pytest

from megatron_loop.studies import PLANS, REGISTERED, archive, docs
from megatron_loop.studies import provenance as P
from testpaths import REPO


def test_docs_are_the_archives_reanalysed():
    """tools/study.py docs --check: every number in the study sections and the README table is what the
    analysis of the archives gives (a changed archive, plan, analysis or hand edit fails here)."""
    assert docs.write_docs(REPO, check=True) == []


def _in_git() -> bool:
    return subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _in_git(), reason="needs the repository's git history (a source tarball has none)")
@pytest.mark.parametrize("name", sorted(PLANS))
def test_registration_precedes_every_confirmatory_result(name):
    plan = PLANS[name]
    path = archive.archive_path(REPO, name)
    if not path.is_file():
        assert name not in REGISTERED or P.registration_commit(REPO, REGISTERED[name])  # registered, not run yet
        return
    document = archive.read(path)
    prov = document["provenance"]
    assert not prov.get("smoke") and prov["clean"] and document["plan_sha256"] == plan.sha256() == REGISTERED[name]
    registered_in = P.registration_commit(REPO, REGISTERED[name])
    assert prov["registration_commit"] == registered_in
    assert P.is_ancestor(REPO, registered_in, prov["commit"])  # the run's code came after the registration
    added = P.git(REPO, "log", "--format=%H", "--diff-filter=A", "--", str(path.relative_to(REPO))).split()
    if added:  # committed: the archive's commit descends from the registration and differs from it
        assert added[-1] != registered_in and P.is_ancestor(REPO, registered_in, added[-1])
    assert {r["seed"] for r in document["runs"]} == {s for arm in plan.arms for s in arm.seeds}
