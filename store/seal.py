"""The seal: a record, outside every campaign, of which campaigns were published and the sha256 of each one's
manifest. A manifest inside a campaign cannot vouch for itself (deleting it would unpublish the campaign,
editing it would re-list edited files); the seal beside the campaigns can.

``<outputs>/campaigns/PUBLISHED.sha256`` holds one ``<sha256>  <campaign>/PUBLISHED`` line per published
campaign, the format ``sha256sum -c PUBLISHED.sha256`` reads in that folder. Only ``python -m store.manifest``
(publishing) and ``python -m store.extend`` (extending) write it.
"""
from __future__ import annotations

from pathlib import Path

from store.files import atomic_write_text
from store.layout import NAME, StoreError
from store.locks import LOCKS, file_lock

SEAL = "PUBLISHED.sha256"
MANIFEST = "PUBLISHED"  # a campaign's manifest, as store.manifest names it
SEAL_LOCK = "seal.lock"  # under the outputs' locks: two campaigns sealed at once both keep their lines


def seal_path(campaigns_dir: str | Path) -> Path:
    """The seal of the campaigns under ``campaigns_dir`` (``<outputs>/campaigns``)."""
    return Path(campaigns_dir) / SEAL


def read_seals(campaigns_dir: str | Path) -> dict[str, str]:
    """Published campaign -> sha256 of its manifest ({} when nothing was ever sealed there); StoreError naming
    the seal and the line when a line is not ``<sha256>  <campaign>/PUBLISHED``."""
    path = seal_path(campaigns_dir)
    if not path.is_file():
        return {}
    seals = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        digest, sep, name = line.partition("  ")
        campaign, slash, manifest = name.partition("/")
        if not (sep and slash and len(digest) == 64 and manifest == MANIFEST and NAME.match(campaign)):
            raise StoreError(f"{path} line {number} is not '<sha256>  <campaign>/{MANIFEST}' (damaged or edited): "
                             "restore it from git")
        seals[campaign] = digest
    return seals


def seal_campaign(campaigns_dir: str | Path, campaign: str, digest: str) -> Path:
    """Record ``digest`` as the sha256 of ``campaign``'s manifest (its line replaced, the others kept)."""
    path = seal_path(campaigns_dir)
    with file_lock(Path(campaigns_dir).parent / LOCKS / SEAL_LOCK):
        seals = {**read_seals(campaigns_dir), campaign: digest}
        return atomic_write_text(path, "".join(f"{seals[c]}  {c}/{MANIFEST}\n" for c in sorted(seals)))
