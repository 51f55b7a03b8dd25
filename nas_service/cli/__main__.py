"""`python -m nas_service.cli`: the `depthscope` command."""

import sys

from nas_service.cli import main

sys.exit(main())
