"""The catalog's codemods, one module each: a function from a libcst module to the rewritten module,
the same module object where nothing matches. :mod:`infrarsi._search.strategy._catalog` names and describes them.
"""

from .checkpoint import no_checkpoint
from .masks import cached_causal_mask
from .optimizer import foreach_optimizer
from .sdpa import sdpa_attention

__all__ = ["cached_causal_mask", "foreach_optimizer", "no_checkpoint", "sdpa_attention"]
