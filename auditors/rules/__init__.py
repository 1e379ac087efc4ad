"""One audit rule per module; each module's ``RULE`` is registered by ``infrarsi.auditors``."""
