"""The guarded search: multi-start over knobs and patches, model-guided, promotion only with receipts."""

from infrarsi._search._engine import SearchOutcome, exploration_budget, promotion_cost, search
from infrarsi._search._pack import export_pack, load_pack
from infrarsi._search._summary import search_summary

__all__ = [
    "search",
    "SearchOutcome",
    "search_summary",
    "export_pack",
    "load_pack",
    "exploration_budget",
    "promotion_cost",
]
