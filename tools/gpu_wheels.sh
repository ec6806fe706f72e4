#!/usr/bin/env bash
# The GPU kit: what the device image lacks, at the versions of requirements-lock.txt, and the data the
# GPU scripts train on; one folder to carry to the device (tools/gpu_first.sh, tools/gpu_report.sh).
#
#   make install                      # once: .venv (the deepspeed wheel is built with it)
#   bash tools/gpu_wheels.sh [DEST]   # DEST default .gpu (ignored by git); 26 MB, a minute
#   bash tools/gpu_wheels.sh --check [DEST]   # the dependency check alone, on the wheels DEST/whl holds
#
# DEST/whl/   wheels for the device's python3 (CPython 3.12, manylinux x86-64), each at the version
#             requirements-lock.txt pins (pip download --no-deps --only-binary=:all: ... NAME==VERSION):
#             the packages the image lacks -- deepspeed (no wheel on PyPI: built here from its sdist as a
#             pure-python wheel, DS_BUILD_OPS=0, its ops compile just in time where used), megatron-core,
#             liger_kernel, hjson, pydantic, pydantic_core, annotated-types, typing-inspection -- and the
#             ones the image has at a version the lock's packages refuse or may refuse: transformers
#             (image 5.17; the project needs >= 5.23), typing_extensions (pydantic needs >= 4.16),
#             packaging (megatron-core needs >= 24.2); the image's version of neither is recorded.
#   DEST/data/  corpus.bin/.idx (~1.5M tokens of the generated corpus) and tokenizer/ (byte-level BPE,
#             2048 ids): the training runs' data, so the device spends no time making it
#   DEST/MANIFEST.txt  the commit, each wheel's size and sha256
#   DEST/device_env.sh `source .gpu/device_env.sh`: the kit installed and the environment exported
#             (megatron_loop/gpu/env.py; a device shell of one's own)
#
# The dependency check: every Requires-Dist of every carried wheel (markers evaluated for CPython 3.12
# on Linux x86-64, extras left out) must be met by a carried wheel or by a package of the device image
# (IMAGE below: versions a session there listed; where none was recorded, the floor that the image's
# own transformers 5.17.0 requires, which its pip had to satisfy). Anything unmet or unverifiable
# stops the kit with exit code 1, naming it: add it to CARRY (at the lock's version) or to IMAGE.
# Wheels of other versions left in DEST/whl are removed (two versions of one package stop the install).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
CHECK_ONLY=0
if [ "${1:-}" = --check ]; then
  CHECK_ONLY=1
  shift
fi
DEST=${1:-.gpu}
VENV_PY=${VENV_PY:-$ROOT/.venv/bin/python}
LOCK=$ROOT/requirements-lock.txt
[ -x "$VENV_PY" ] || { echo "error: $VENV_PY: not found; run 'make install' first (the deepspeed wheel is built with it)" >&2; exit 2; }
[ -f "$LOCK" ] || { echo "error: $LOCK: not found" >&2; exit 2; }

# the packages carried, by their names in the lock
CARRY=(deepspeed megatron-core liger_kernel hjson pydantic pydantic_core annotated-types typing-inspection
       typing_extensions transformers packaging)

lock_version() {  # lock_version NAME: the version requirements-lock.txt pins for NAME (names compared as PEP 503)
  "$VENV_PY" - "$LOCK" "$1" <<'PY'
import re, sys
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
want = norm(sys.argv[2])
for line in open(sys.argv[1]):
    m = re.match(r"^([A-Za-z0-9_.-]+)==(\S+)", line.strip())
    if m and norm(m.group(1)) == want:
        print(m.group(2)); break
else:
    sys.exit(f"error: {sys.argv[2]}: not pinned in {sys.argv[1]}")
PY
}

mkdir -p "$DEST/whl"
PIP_DOWNLOAD=("$VENV_PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
              --abi cp312 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
              --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
              -q -d "$DEST/whl")
WANT=()
for name in "${CARRY[@]}"; do
  version=$(lock_version "$name")
  WANT+=("$name==$version")
done
echo "kit: ${WANT[*]}"

# deepspeed: sdist -> pure-python wheel (no compiled ops; they build just in time on the device)
ds=$(lock_version deepspeed)
if [ $CHECK_ONLY = 0 ] && ! ls "$DEST/whl/deepspeed-$ds-"*.whl >/dev/null 2>&1; then
  tmp=$(mktemp -d)
  "$VENV_PY" -m pip download --no-deps --no-binary=:all: -q -d "$tmp" "deepspeed==$ds"
  DS_BUILD_OPS=0 "$VENV_PY" -m pip wheel -q --no-deps --no-build-isolation "$tmp/deepspeed-$ds.tar.gz" -w "$DEST/whl"
  rm -rf "$tmp"
fi
for spec in "${WANT[@]}"; do
  [ $CHECK_ONLY = 0 ] || break
  [ "${spec%%==*}" = deepspeed ] && continue
  "${PIP_DOWNLOAD[@]}" "$spec"
done

# the check: one wheel per carried package at the lock's version (others removed), every requirement met
"$VENV_PY" - "$DEST/whl" "${WANT[@]}" <<'PY'
import pathlib, re, sys, zipfile
from email.parser import Parser

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

whl = pathlib.Path(sys.argv[1])
want = {canonicalize_name(s.split("==")[0]): Version(s.split("==")[1]) for s in sys.argv[2:]}
# The device image (CPython 3.12.3): recorded versions, or the floor its transformers 5.17.0 requires.
IMAGE = {"torch": "2.11.0", "triton": "3.6.0", "transformers": "5.17.0", "tokenizers": "0.23.2",
         "safetensors": "0.8.0", "huggingface-hub": "1.33.0", "accelerate": "1.15.0", "numpy": "2.5.2",
         "regex": ">=2025.10.22", "tqdm": ">=4.60", "pyyaml": ">=5.1", "packaging": ">=20.0", "typer": ">=0",
         "einops": ">=0", "msgpack": ">=0", "ninja": ">=0", "psutil": ">=0", "py-cpuinfo": ">=0", "filelock": ">=0"}
env = default_environment()
env.update(python_version="3.12", python_full_version="3.12.3", sys_platform="linux", platform_system="Linux",
           platform_machine="x86_64", implementation_name="cpython", platform_python_implementation="CPython",
           os_name="posix", extra="")
carried, problems, lines = {}, [], []
for path in sorted(whl.glob("*.whl")):
    name, version, _, _ = parse_wheel_filename(path.name)
    if name not in want or version != want[name]:
        print(f"removing {path.name}: not in the kit at the lock's version")
        path.unlink()
        continue
    carried[name] = (version, path)
for name in sorted(set(want) - set(carried)):
    problems.append(f"{name}=={want[name]}: no wheel was downloaded")


def image_meets(req: Requirement, have: str) -> bool:
    if not have.startswith(">="):
        return req.specifier.contains(Version(have), prereleases=True)
    floor = Version(have[2:])  # only a floor is known: met if every clause is a floor at or below it
    return all(s.operator in (">=", ">") and Version(s.version) <= floor for s in req.specifier)


for name, (version, path) in sorted(carried.items()):
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        requires = Parser().parsestr(z.read(meta).decode()).get_all("Requires-Dist") or []
    for text in requires:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        dep = canonicalize_name(req.name)
        if dep in carried:
            ok = req.specifier.contains(carried[dep][0], prereleases=True)
            how = f"carried {carried[dep][0]}"
        elif dep in IMAGE:
            ok = image_meets(req, IMAGE[dep])
            how = f"image {IMAGE[dep]}"
        else:
            ok, how = False, "neither carried nor known in the image"
        lines.append(f"  {name} {version} requires {req}: {how}{'' if ok else '  <-- NOT MET'}")
        if not ok:
            problems.append(f"{name} {version} requires {req}: {how}")
print("dependency check of the carried wheels:")
print("\n".join(lines))
if problems:
    print("error: the kit does not cover these (add them to CARRY at the lock's version, or to IMAGE):",
          *problems, sep="\n  ", file=sys.stderr)
    sys.exit(1)
print(f"dependency check: every requirement of the {len(carried)} carried wheels is met")
PY
[ $CHECK_ONLY = 0 ] || exit 0

# the data the training runs read (as the first session would build it, larger: megatron_loop/gpu/env.py)
if ! [ -f "$DEST/data/corpus.idx" ] || ! [ -f "$DEST/data/corpus.bin" ] || ! [ -f "$DEST/data/tokenizer/tokenizer.json" ]; then
  tmp=$(mktemp -d)
  rm -rf "$DEST/data"
  OMP_NUM_THREADS=1 PYTHON=$VENV_PY PYTHONPATH=$ROOT "$VENV_PY" -m megatron_loop.gpu.env data "$DEST/data" "$tmp" 2 \
      --prose-docs 12000 --reasoning-docs-per-task 4000 --valid-docs 10 --eval-items-per-depth 1 \
      > "$tmp/data.log" 2>&1 || { cat "$tmp/data.log" >&2; exit 1; }
  rm -rf "$tmp"
fi

# for a device shell of one's own: `source .gpu/device_env.sh` installs the kit and exports the environment
cat > "$DEST/device_env.sh" <<'SH'
# source .gpu/device_env.sh: install this kit's wheels and export the environment (megatron_loop/gpu/env.py)
_kit=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
_repo=$(cd "$_kit/.." && pwd)
PYTHONPATH=$_repo python3 -m megatron_loop.gpu.env install "$_kit" --site "${GPU_SITE:-/tmp/site}" \
    && eval "$(PYTHONPATH=$_repo python3 -m megatron_loop.gpu.env exports --site "${GPU_SITE:-/tmp/site}")"
SH

{
  echo "GPU kit made $(date -u '+%Y-%m-%d %H:%M UTC') from commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown) by tools/gpu_wheels.sh"
  echo "wheels (requirements-lock.txt versions, CPython 3.12 manylinux x86-64):"
  (cd "$DEST/whl" && for w in *.whl; do printf '  %-80s %9s  %s\n' "$w" "$(stat -c %s "$w")" "$(sha256sum "$w" | cut -c1-16)"; done)
  echo "data: $(cat "$DEST/data/corpus.stats.json" 2>/dev/null | tr -d '\n' | cut -c1-300)"
  echo "size: $(du -sh "$DEST" | cut -f1)"
} > "$DEST/MANIFEST.txt"
cat "$DEST/MANIFEST.txt"
