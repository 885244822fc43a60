"""Tool (function) calling for chat: the model family's call format, declarations, parsing and forced-call grammars.

``gemma4.py`` holds Gemma-4's wire format (``<|tool_call>call:NAME{...}<tool_call|>``);
``grammar.py`` builds the EBNF that forces a call (``tool_choice`` ``required`` or a named
function); ``stream.py`` turns streamed text into content and tool-call deltas.
"""
