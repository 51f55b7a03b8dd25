import sys

from nas_service.runner.loop import main

sys.exit(main())
