"""Pure helpers: the chart values one attempt adds to the run's (suite/backends/kube/values.py).

What the cluster options say (the image to run, whether to resume checkpoints, the start timeout)
and what is fresh for every attempt (its checkpoint directory), kept apart from the run's own
values so that those stay a function of the RunSpec alone.
"""
from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Any

from shardbench.suite.backends import PULL_POLICIES

# repository[:tag] or repository@sha256:<64 hex>; a registry host may carry a port (host:5000/x).
_REPOSITORY = r"[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]+)?(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"sha256:[0-9a-f]{64}"
_REFERENCE = re.compile(rf"(?P<repository>{_REPOSITORY})(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?")


@dataclass(frozen=True)
class ImageChoice:
    """The image the pods run, as the person asked for it (None: the values file's)."""

    repository: str | None = None
    tag: str | None = None
    digest: str | None = None
    pull_policy: str | None = None

    def values(self) -> dict[str, Any]:
        image = {k: v for k, v in (("repository", self.repository), ("tag", self.tag),
                                    ("digest", self.digest), ("pullPolicy", self.pull_policy)) if v}
        return {"image": image} if image else {}


def parse_reference(ref: str) -> tuple[str, str | None, str | None]:
    """(repository, tag, digest) of an image reference; ValueError with the fix when malformed."""
    m = _REFERENCE.fullmatch(ref.strip())
    if not m:
        raise ValueError(f"--image {ref!r} is not an image reference: use REPOSITORY[:TAG] or "
                         "REPOSITORY@sha256:<64 hex>, e.g. registry.example.com/team/shardbench:0.1.0-cuda")
    return m["repository"], m["tag"], m["digest"]


def image_choice(image: str | None = None, repository: str | None = None, tag: str | None = None,
                 pull_policy: str | None = None) -> ImageChoice:
    """The cluster options' image flags as one choice; ValueError (one line) when they conflict."""
    ref_repo, ref_tag, digest = parse_reference(image) if image else (None, None, None)
    if repository and ref_repo:
        raise ValueError("--image and --image-repository both name the repository: give one")
    if tag and (ref_tag or digest):
        raise ValueError("--image already has a tag or digest and --image-tag gives another: give one")
    if repository:
        parse_reference(repository)
    if tag and not re.fullmatch(_TAG, tag):
        raise ValueError(f"--image-tag {tag!r} is not a tag: letters, digits, _ . - (at most 128, not starting with . "
                         "or -)")
    if pull_policy and pull_policy not in PULL_POLICIES:
        raise ValueError(f"--image-pull-policy {pull_policy!r}: use one of {', '.join(PULL_POLICIES)}")
    return ImageChoice(repository or ref_repo, tag or ref_tag, digest, pull_policy)


def attempt_values(values: dict[str, Any], start_timeout_s: float, resume_checkpoints: bool,
                   attempt: str | None = None) -> dict[str, Any]:
    """What this attempt adds to the release's merged values:
    - the launcher waits for the workers' ssh as long as the suite waits for the launcher;
    - checkpoints go to a directory of this attempt's own (unless resuming is asked for), so a
      rerun never continues from an earlier attempt's state on the kept volume;
    - a results volume mounted by workers on several nodes is ReadWriteMany."""
    out: dict[str, Any] = {"workerWaitSeconds": max(1, int(start_timeout_s))}
    if (values.get("checkpoint") or {}).get("enabled"):
        out["checkpoint"] = {"resume": bool(resume_checkpoints), "attempt": attempt or uuid.uuid4().hex[:12]}
    persistence = values.get("persistence") or {}
    if persistence.get("enabled") and not persistence.get("existingClaim") and int(values.get("workers") or 1) > 1:
        out["persistence"] = {"accessModes": ["ReadWriteMany"]}
    return out
