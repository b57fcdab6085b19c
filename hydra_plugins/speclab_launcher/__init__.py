"""speclab's local parallel launcher: Hydra's joblib launcher where one dead worker fails its own job alone
(the work is in pipeline/jobs/pool.py; Hydra takes launchers only from the ``hydra_plugins`` namespace).

``hydra_plugins`` itself has no ``__init__.py``: it is a namespace shared with the installed Hydra plugins."""
from __future__ import annotations

from typing import Sequence

from hydra.core.utils import JobReturn
from hydra_plugins.hydra_joblib_launcher.joblib_launcher import JoblibLauncher


class SpeclabJoblibLauncher(JoblibLauncher):
    """``conf/hydra/launcher/speclab_joblib.yaml``: the joblib launcher's settings, of which ``n_jobs`` is read."""

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from pipeline.jobs.pool import launch

        return launch(self, job_overrides, initial_job_idx)
