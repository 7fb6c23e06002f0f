"""HTTPS for ``hllm serve``: ``--ssl-certfile`` / ``--ssl-keyfile`` checked before the server starts, then
passed to uvicorn (its ``ssl_certfile`` / ``ssl_keyfile``, https://www.uvicorn.org/settings/#https).

uvicorn loads the files only when it starts, and a bad file there is a traceback; :func:`tls_options`
loads them once with :meth:`ssl.SSLContext.load_cert_chain` first, so a missing file, a key that does not
match the certificate or a file that is not PEM is an error naming the file (CLI exit 2).
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path

from hllm.errors import HllmError


def tls_options(certfile: str | os.PathLike | None, keyfile: str | os.PathLike | None) -> dict | None:
    """uvicorn's TLS options for a PEM certificate chain and its private key, or None when neither is given.

    ``keyfile`` may be left out when ``certfile`` holds the key too. Raises: HllmError (a key without a
    certificate, a missing or unreadable file, a file that is not PEM, a key that does not match).
    """
    if certfile is None and keyfile is None:
        return None
    if certfile is None:
        raise HllmError("--ssl-keyfile needs --ssl-certfile (the certificate chain, PEM)")
    for flag, f in (("--ssl-certfile", certfile), ("--ssl-keyfile", keyfile)):
        if f is not None and not Path(f).is_file():
            raise HllmError(f"{flag} {f}: not a file")
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(certfile, keyfile)
    except ssl.SSLError as e:
        raise HllmError(f"--ssl-certfile {certfile} / --ssl-keyfile {keyfile}: not a PEM certificate chain and its "
                        f"matching private key ({e.reason or e})") from None
    except OSError as e:
        raise HllmError(f"--ssl-certfile {certfile} / --ssl-keyfile {keyfile}: {e.strerror or e}") from None
    return {"ssl_certfile": str(certfile), **({"ssl_keyfile": str(keyfile)} if keyfile is not None else {})}
