from graph_kvcache_mcp.cli import main

raise SystemExit(main())
