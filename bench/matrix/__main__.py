from bench.matrix.run import main

raise SystemExit(main())
