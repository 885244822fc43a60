"""The checkpoints this project builds itself (no model hub is reached): the tiny deterministic ones, among them
the server's embedded default model (``impl.models_builtin``), and the streamed full-size ones."""
