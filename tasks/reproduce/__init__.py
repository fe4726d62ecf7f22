"""`fedapt reproduce`: the seeds' claims as data (``registry``: one module per claim), the
experiments each profile runs (``runs``) and the report that reads them (``report``)."""
