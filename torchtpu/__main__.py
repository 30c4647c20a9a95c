"""`python -m torchtpu`: versions, platform and devices, settings, and what to fix (exit 1)."""
from torchtpu._report import main

raise SystemExit(main())
