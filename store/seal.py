"""The seal: a record, outside every campaign, of which campaigns were published and the sha256 of each one's
manifest. A manifest inside a campaign cannot vouch for itself (deleting it would unpublish the campaign,
editing it would re-list edited files); the seal beside the campaigns can.

``<outputs>/campaigns/PUBLISHED.sha256`` holds one ``<sha256>  <campaign>/PUBLISHED`` line per published
campaign, the format ``sha256sum -c PUBLISHED.sha256`` reads in that folder. Only ``python -m store.manifest``
(publishing) and ``python -m store.extend`` (extending) write it.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
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


def checksum_lines(path: Path, form: str, name_ok: Callable[[str], bool] = bool) -> Iterator[tuple[str, str]]:
    """(sha256, name) of each line of ``path`` in sha256sum's ``<sha256>  <name>`` format (manifests and seals);
    StoreError naming the file and the line when one is not ``form`` or its name fails ``name_ok``."""
    for number, line in enumerate(path.read_text().splitlines(), 1):
        digest, sep, name = line.partition("  ")
        if not (sep and len(digest) == 64 and name_ok(name)):
            raise StoreError(f"{path} line {number} is not '{form}' (damaged or edited): restore it from git")
        yield digest, name


def _sealed_manifest(name: str) -> bool:
    campaign, slash, manifest = name.partition("/")
    return bool(slash and manifest == MANIFEST and NAME.match(campaign))


def read_seals(campaigns_dir: str | Path) -> dict[str, str]:
    """Published campaign -> sha256 of its manifest ({} when nothing was ever sealed there); StoreError naming
    the seal and the line when a line is not ``<sha256>  <campaign>/PUBLISHED``."""
    path = seal_path(campaigns_dir)
    if not path.is_file():
        return {}
    lines = checksum_lines(path, f"<sha256>  <campaign>/{MANIFEST}", _sealed_manifest)
    return {name.partition("/")[0]: digest for digest, name in lines}


def seal_campaign(campaigns_dir: str | Path, campaign: str, digest: str) -> Path:
    """Record ``digest`` as the sha256 of ``campaign``'s manifest (its line replaced, the others kept)."""
    path = seal_path(campaigns_dir)
    with file_lock(Path(campaigns_dir).parent / LOCKS / SEAL_LOCK):
        seals = {**read_seals(campaigns_dir), campaign: digest}
        return atomic_write_text(path, "".join(f"{seals[c]}  {c}/{MANIFEST}\n" for c in sorted(seals)))
