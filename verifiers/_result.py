"""What a verifier returns: one check's id, status and the reason."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["CheckResult", "STATUSES", "FAMILIES"]

STATUSES = ("pass", "fail", "unchecked", "skipped")
FAMILIES = ("integrity", "scope", "numerics", "timing", "stats", "audit")


@dataclass(frozen=True)
class CheckResult:
    """``unchecked`` means the evidence was missing: it fails like ``fail`` does."""

    id: str
    status: str
    detail: str
    evidence: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"check {self.id}: status {self.status!r} is not one of {STATUSES}")
        if self.id.split(".", 1)[0] not in FAMILIES:
            raise ValueError(f"check {self.id}: id must start with a family, one of {FAMILIES}")

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    def to_json(self) -> dict:
        return {"id": self.id, "status": self.status, "detail": self.detail}
