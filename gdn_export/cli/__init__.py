"""The `gdn-export` command line; one module per subcommand."""
