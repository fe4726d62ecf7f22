"""The pieces fedapt's flows run, by room (top to bottom; a room imports only those below it):
``reproduce`` (the papers' claims), ``training`` (a cell's run), ``data`` (what training
reads), ``results`` (what a run leaves for people), ``tracking`` (MLflow), ``grid`` (a run's
cells), ``config`` (the params) and ``io`` (file helpers)."""
