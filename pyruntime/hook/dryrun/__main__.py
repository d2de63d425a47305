"""``python -m pyruntime.hook.dryrun``: one dry run in this process (`driver.main`)."""

from .driver import main

raise SystemExit(main())
