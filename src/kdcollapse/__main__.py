from kdcollapse.cli import main

raise SystemExit(main())
