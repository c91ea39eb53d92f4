from bench.sampler.run import main

raise SystemExit(main())
