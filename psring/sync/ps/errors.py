"""``ProtocolError``, torch-free: ``consistency`` raises it too, and the launcher's checks import that module
(``config_checks.check_ps``) without torch."""
from __future__ import annotations


class ProtocolError(ValueError):
    """A message that does not follow the protocol's format (``protocol.py``); the server answers it with an error
    reply."""
