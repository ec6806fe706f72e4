"""The registered plans: the sha256 of each study's plan text (:meth:`StudyPlan.text`), committed in the
registration commit before any confirmatory run of the study, and never edited afterwards (a changed plan
is a new study under a new name). ``tools/study.py gate`` refuses a run whose plan hashes otherwise; the
registration commit is the commit that added the hash to this file (``git log -S HASH -- this file``).
"""

REGISTERED: dict[str, str] = {
    "finding1_r2": "ac3b48d7752c7c41e36653f3abab297aed0e172c521bf9550e3285183621e556",
    "finding2": "83ffa23dd5d2b12138627725b570d81ad200dcf799865dc9253bad0f84a88873",
    "finding3": "0c8afafdc3907d9df373c520756f243be0fd06dda0d96ed5ffb0c63f67fd3037",
}
