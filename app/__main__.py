"""`python -m app`: the desktop app (also the `headroom` script)."""
from .main import main

raise SystemExit(main())
