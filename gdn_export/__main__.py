from gdn_export.cli.main import console_main

console_main()
