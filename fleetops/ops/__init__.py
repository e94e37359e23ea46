"""Front-end-free operations: the one place where the CLI, the TUI and ``remediate`` turn an
operator's intent into actions on nodes (reset, drain, resume, apply), with the same safety
rules whichever front end starts them. Nothing here imports Textual, argparse front ends or
another front end's module; modules import their heavy dependencies (paramiko, ansible) lazily
so the package stays importable on the agent's cold path."""
