"""The harness: a user's command becomes runs and reports. The registry of systems
(systems), RunConfig (config), the CLI (cli/), experiments/, the simulator and the paper's
tables (sim/) and reporting/. The top layer: nothing below imports it."""
