from ddptop.cli import main

raise SystemExit(main())
