"""`python -m torchtpu`: versions, platform and devices, settings, and what to fix (exit 1).
`python -m torchtpu patches`: every change torchtpu makes to other projects' code."""
import sys

if sys.argv[1:] == ["patches"]:
    from torchtpu._patches import main
else:
    from torchtpu._report import main

raise SystemExit(main())
