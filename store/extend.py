"""Extending a published campaign on purpose: the one way a job writes into a campaign that has a manifest.

    python -m store.extend CAMPAIGN [--outputs-dir outputs] -- PIPELINE OVERRIDES

runs ``python -m pipeline.run PIPELINE OVERRIDES campaign=CAMPAIGN`` (one job or a sweep, any launcher) with a
one-time permit, then lists the files its jobs added in the campaign's manifest, seals the manifest and says
so, naming each file added. Its jobs may add files, never replace one: ``force`` and ``overwrite_published``
are refused, and so is a listed file that no longer reads. Without ``--`` nothing runs: the files an
interrupted extension added are checked and listed (rerunning the same command does the same after finishing
its jobs, the complete ones skipped).

Every other job into a published campaign is refused before it computes anything, in one line naming the
campaign, its manifest and this command (``job_may_write``, ``check_published_files``, ``refusal``); a job whose
files are all there and complete says so and writes nothing. The permit is a token in ``SPECLAB_EXTEND`` that matches the file this
command holds under ``<outputs>/.locks/<campaign>/`` while it runs, so a variable left set in a shell opens
nothing once the command has ended.
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from store.layout import STAGES, StoreError, campaign_dir
from store.locks import extension_paths, file_lock
from store.manifest import (
    EXTEND, campaign_files, campaign_problem, is_published, manifest_path, read_manifest, write_manifest,
)
from store.records import StageFileError, open_stage_file
from store.seal import seal_path

PERMIT_ENV = "SPECLAB_EXTEND"
ANSWERS = "answers"  # a campaign's stored first answers (pipeline/prompts/turns.py ANSWERS)
NOT_HERE = {"campaign": "the campaign is the command's CAMPAIGN", "outputs_dir": "the folder is its --outputs-dir",
            "force": "an extension adds jobs, a published file is never replaced",
            "overwrite_published": "an extension adds jobs, a published file is never replaced"}


def extension_permitted(outputs_dir: str | Path, campaign: str) -> bool:
    """Whether this process runs inside ``python -m store.extend`` of ``campaign`` (its permit is live)."""
    token = os.environ.get(PERMIT_ENV, "")
    try:
        return bool(token) and extension_paths(outputs_dir, campaign)[1].read_text().strip() == f"{campaign} {token}"
    except OSError:
        return False


@contextmanager
def _permit(outputs_dir: str | Path, campaign: str) -> Iterator[dict[str, str]]:
    """A permit for the block: the environment its jobs need, the file it matches removed at the end."""
    path = extension_paths(outputs_dir, campaign)[1]
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(16)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"{campaign} {token}\n")
    try:
        yield {PERMIT_ENV: token}
    finally:
        path.unlink(missing_ok=True)


def job_may_write(outputs_dir: str | Path, campaign: str, force: bool, overwrite_published: bool) -> bool:
    """Whether a job may write into ``campaign``: always into an unpublished one; into a published one only
    under ``python -m store.extend`` (and then only new files). StoreError, one line, for ``force`` or
    ``overwrite_published`` on a published campaign, and for a published campaign that is not as published."""
    folder = campaign_dir(outputs_dir, campaign)
    if not is_published(folder):
        return True
    where = f"campaign {campaign!r} is published ({manifest_path(folder)})"
    for key, on in (("force", force), ("overwrite_published", overwrite_published)):
        if on:
            raise StoreError(f"{key}=true is not allowed: {where} and its files are never replaced; run the job in "
                             f"another campaign (campaign=NAME), or add new jobs with "
                             f"{EXTEND.format(campaign=campaign)}")
    permitted = extension_permitted(outputs_dir, campaign)
    if problem := campaign_problem(folder, allow_extra=permitted):
        raise StoreError(f"{where} but has changed: {problem}")
    return permitted


def refusal(outputs_dir: str | Path, campaign: str, part: str, path: Path, overrides: list[str] | None) -> StoreError:
    """Why a job that would write ``path`` into published ``campaign`` does not run, in one line with the command
    that runs it on purpose (its own ``overrides`` when known)."""
    folder = campaign_dir(outputs_dir, campaign)
    kept = [o for o in overrides or [] if override_key(o) not in ("campaign", "outputs_dir")]
    command = f"python -m store.extend {campaign} -- {' '.join(kept)}" if overrides is not None else EXTEND.format(
        campaign=campaign)
    return StoreError(f"[{part}] campaign {campaign!r} is published ({manifest_path(folder)}): no job writes into "
                      f"it, and this one would add {path.name}; to add it on purpose: {command.rstrip()}")


def check_published_files(outputs_dir: str | Path, campaign: str,
                          files: dict[str, tuple[Path, bool, str | None]],
                          overrides: Callable[[], list[str] | None]) -> None:
    """A job's stage files in published ``campaign`` (part -> its path, whether the job would write it anew, why the
    file there is not a finished result or None): StoreError, one line, for the first one the job would write
    without ``python -m store.extend`` (``refusal``, naming the job's ``overrides()``), and for one there that does
    not read as a finished result, which is left alone. Under the extension a job adds files, never replaces one."""
    may_add = extension_permitted(outputs_dir, campaign)
    for part, (path, anew, problem) in files.items():
        if anew and not may_add:
            raise refusal(outputs_dir, campaign, part, path, overrides())
        if problem:
            raise StoreError(f"[{part}] {path} is not a finished result ({problem}): it belongs to published "
                             f"campaign {campaign!r}, so it is left alone")


def override_key(override: str) -> str:
    """The dotted key a Hydra override sets (``+stage.x=1`` -> ``stage.x``)."""
    return override.split("=", 1)[0].lstrip("+~")


def check_overrides(overrides: list[str]) -> None:
    for override in overrides:
        if override_key(override) in NOT_HERE:
            raise StoreError(f"{override!r} is not allowed after --: {NOT_HERE[override_key(override)]}")


def added_problem(folder: Path, names: list[str]) -> str | None:
    """None when every file in ``names`` (paths in ``folder``) is a complete stage file of its stage and this
    campaign, or a stored answer; otherwise one line naming the first that is not."""
    for name in names:
        path, parts = folder / name, Path(name).parts
        dot = parts[-1].startswith(".")
        if len(parts) == 2 and parts[0] in STAGES and name.endswith(".parquet") and not dot:
            try:
                open_stage_file(path, stage=parts[0], campaign=folder.name)
            except StageFileError as err:
                return f"{path} cannot be listed: it {err.problem}"
        elif len(parts) == 2 and parts[0] == ANSWERS and name.endswith(".json") and not dot:
            try:
                json.loads(path.read_text())
            except (ValueError, UnicodeDecodeError):
                return f"{path} cannot be listed: it is not a stored answer (JSON)"
        else:
            return f"{path} cannot be listed: it is neither a stage file nor a stored answer (remove it)"
    return None


def _pipeline(outputs_dir: str | Path, campaign: str, overrides: list[str]) -> int:
    """Run the pipeline's jobs into ``campaign`` under a permit; their exit status."""
    folder = Path(outputs_dir).resolve()
    outputs = [] if folder == (Path.cwd() / "outputs").resolve() else [f"outputs_dir={folder}"]  # else the default
    with _permit(outputs_dir, campaign) as env:
        command = [sys.executable, "-m", "pipeline.run", *overrides, f"campaign={campaign}", *outputs]
        return subprocess.run(command, env={**os.environ, **env}).returncode


def extend(outputs_dir: str | Path, campaign: str, overrides: list[str] | None) -> int:
    """Run the pipeline with ``overrides`` into published ``campaign`` (nothing when None), then list and seal
    the files added; prints what it did. The exit status: the pipeline's when it failed (manifest unchanged)."""
    folder = campaign_dir(outputs_dir, campaign)
    manifest = manifest_path(folder)
    if not is_published(folder):
        raise StoreError(f"campaign {campaign!r} is not published ({manifest} does not exist): its jobs need no "
                         f"extension (python -m pipeline.run campaign={campaign} ...); publish it with "
                         f"python -m store.manifest {campaign}")
    check_overrides(overrides or [])
    lock = extension_paths(outputs_dir, campaign)[0]
    with file_lock(lock, lambda holder: print(f"store.extend: campaign {campaign!r} is being extended by "
                                              f"{holder or 'another process'}: waiting", file=sys.stderr, flush=True)):
        if problem := campaign_problem(folder, allow_extra=True):
            raise StoreError(problem)
        listed = read_manifest(folder)
        status = _pipeline(outputs_dir, campaign, overrides) if overrides is not None else 0
        if problem := campaign_problem(folder, allow_extra=True):  # a listed file changed meanwhile: never sealed
            raise StoreError(problem)
        added = [name for name in campaign_files(folder) if name not in listed]
        if status != 0:
            unlisted = (f"; {len(added)} files added are not listed yet (the analysis refuses the campaign until "
                        "they are): rerun this command to finish and list them") if added else ""
            print(f"store.extend: error: the pipeline exited with {status}: {manifest} is unchanged{unlisted}",
                  file=sys.stderr)
            return status
        if problem := added_problem(folder, added):
            raise StoreError(problem)
        if not added:
            print(f"store.extend: nothing added to published campaign {campaign!r}: {manifest} is unchanged")
            return 0
        write_manifest(outputs_dir, campaign)
    print(f"store.extend: extended published campaign {campaign!r}: {manifest} rewritten, "
          f"{len(listed) + len(added)} files listed, {len(added)} added:")
    for name in added:
        print(f"  {folder / name}")
    print(f"store.extend: {seal_path(folder.parent)} holds the new manifest's sha256; commit both with the files added")
    return 0


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, overrides = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, None)
    parser = argparse.ArgumentParser(prog="python -m store.extend", usage="%(prog)s CAMPAIGN [--outputs-dir DIR] "
                                     "[-- PIPELINE OVERRIDES]",
                                     description="Add jobs to a published campaign on purpose: run them, then list "
                                                 "the files added in its manifest and seal it.")
    parser.add_argument("campaign")
    parser.add_argument("--outputs-dir", default="outputs")
    args = parser.parse_args(ours)
    try:
        status = extend(args.outputs_dir, args.campaign, overrides)
    except StoreError as err:
        print(f"store.extend: error: {err}", file=sys.stderr)
        sys.exit(1)
    sys.exit(status)


if __name__ == "__main__":
    main()
