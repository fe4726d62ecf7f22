"""The ``fedapt`` command line: one module per command group, each command a plain function
under ``@guarded`` (its one-line error guard), registered here on one Typer app in the order
of `fedapt --help`. What they share, one module per job: ``console`` (the app, consoles, the
error line), ``environment`` (what every command starts with), ``params`` (--params/--set),
``guards`` (the error guard), ``stopping`` (signals, the last line), ``logs`` (library log
records), ``runguards`` (a run's services watch, divergence) and ``tables`` (results)."""

from __future__ import annotations

import typer

from flows.cli import deployments, experiment, reproduce, services, stages
from flows.cli.console import OneLineErrors, app
from flows.cli.environment import offline_defaults
from flows.cli.tables import results_table

__all__ = ["app", "main", "results_table"]

app.callback()(offline_defaults)
for command in (experiment.run, experiment.partition, experiment.models):
    app.command()(command)

deploy_app = typer.Typer(
    cls=OneLineErrors,
    help="Deploy the experiment flow on a cron schedule (fedapt deploy --cron ...), or list, "
    "pause, resume or delete its deployments.",
    no_args_is_help=False,
)
deploy_app.callback(invoke_without_command=True)(deployments.deploy)
deploy_app.command("ls")(deployments.ls)
for command in (deployments.pause, deployments.resume, deployments.delete):
    deploy_app.command()(command)
app.add_typer(deploy_app, name="deploy")

app.command()(services.up)
app.command()(services.down)
app.command("env")(services.env_)
app.command()(services.status)
for command in (stages.prepare, stages.validate, stages.pretrain, stages.train, stages.report):
    app.command()(command)
app.command()(reproduce.reproduce)


def main() -> None:
    """The ``fedapt`` command: what it and its child processes print reaches the terminal
    with every URI's password masked (``flows.streams.mask_descriptors``)."""
    from flows.streams import mask_descriptors

    mask_descriptors()
    app(prog_name="fedapt")
