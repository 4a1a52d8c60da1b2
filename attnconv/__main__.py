from attnconv.cli import main

raise SystemExit(main())
