"""The nvidia_toolkit role's check of NVIDIA's repository signing key (key.yml), from ``gpg --show-keys --with-colons``.

The key is read by gpg on the controller; this decides from gpg's colon listing (GnuPG doc/DETAILS, "Format of the
colon listings": one record per line, fields separated by ':'; a ``pub`` record per primary key, the ``fpr`` record
with its fingerprint in field 10 right after it; a subkey's ``sub`` has its own ``fpr`` right after it, which is not
the primary key's).
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import pairwise
from typing import Any


def gpg_primary_keys(colons: str) -> dict[str, Any]:
    """{count: the ``pub`` records, fingerprints: the ``fpr`` right after each ``pub`` (upper case)}. Only an ``fpr``
    whose record directly follows a ``pub`` counts: a subkey's, or one after another record, is not a primary key's."""
    records = [line.split(":") for line in colons.splitlines()]
    fingerprints = [r[9].upper() for before, r in pairwise(records) if before[0] == "pub" and r[0] == "fpr"]
    return {"count": sum(r[0] == "pub" for r in records), "fingerprints": fingerprints}


def key_problems(gpg: Mapping[str, Any], fingerprint: str, host: str, source: str) -> list[str]:
    """The refusal of key.yml, empty when the key file holds exactly one key and its fingerprint is ``fingerprint``
    (spaces and case ignored). ``gpg`` is the registered result of ``gpg --show-keys --with-colons`` (rc, stdout,
    stderr); ``source`` is where the key came from (the URL, or the installed key's path)."""
    keys = gpg_primary_keys(gpg["stdout"])
    expected = fingerprint.replace(" ", "").upper()
    if gpg["rc"] != 0:
        why = f"gpg could not read it (rc {gpg['rc']}: {gpg['stderr'].strip()})"
    elif keys["count"] != 1:
        why = f"it holds {keys['count']} keys ({', '.join(keys['fingerprints'])}), want exactly one"
    elif keys["fingerprints"] != [expected]:
        # a pub record without its fpr (not a GnuPG listing) shows as no fingerprint
        why = f"it has fingerprint {(keys['fingerprints'] or ['(none)'])[0]}, the inventory pins {expected}"
    else:
        return []
    return [
        f"{host}: the NVIDIA repository key from {source} (nvidia_toolkit_key_url) does not match "
        f"nvidia_toolkit_key_fingerprint: {why}. Nothing was written. Check where the URL really leads; change "
        "nvidia_toolkit_key_fingerprint only after checking the new key with its publisher."
    ]


class FilterModule:
    """Ansible filters: nvidia_toolkit_key_problems."""

    def filters(self) -> dict[str, Any]:
        return {"nvidia_toolkit_key_problems": key_problems}
