"""A dataset into chunks: `prepare_run` (orch prepare) and `check_run` (orch prepare --check), prepare/pipeline.py."""

from orchestrator.prepare.pipeline import CheckReport, PrepareReport, check_run, prepare_run

__all__ = ["CheckReport", "PrepareReport", "check_run", "prepare_run"]
