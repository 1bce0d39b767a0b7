"""SFT cold-start sources (paper §4.1): each row of a source, whatever its format, becomes a conversation in the
rStar2 wire format (rstar2/chat.py), or is dropped under a counted reason.

Modules: ``sources`` (spec checks, reading through rstar2/data/loaders.py, sampling, the per-source loop),
one module per format (``messages``, ``sharegpt``, ``alpaca``, ``toolformer``) sharing ``conversation`` (the
turn-order rules and tool calls of the chat formats), ``generated`` (sources made by code: ``string_tools``),
``pycalls`` (Python calls inside rows), ``math_filter`` and ``common`` (reason sentences, sandbox runner).
The stage is rstar2/stages/sft_data.py.
"""
