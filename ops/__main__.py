from ops.cli import main

raise SystemExit(main())
