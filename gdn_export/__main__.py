import sys

from gdn_export.cli.main import main

sys.exit(main())
