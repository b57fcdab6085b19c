"""The engines that run a job's requests, one package each, holding all of that engine's code: speclab's own loops
(``speclab/``), llama.cpp's servers (``llama_cpp/``). A package holds ``conf.py`` (its settings' schema, the
``conf/engine/<name>.yaml`` group option: found by name, pipeline/config/schema.py ``ENGINES``), ``runner.py`` (its
``Engine``, the seam every stage calls: pipeline/engines/base.py) and whatever the engine needs besides (a build, a
server, a client, its arms as the flags a user writes), torch-free where it can be.

May import speclab, store and pipeline's floors up to pipeline.engines (the seam), never pipeline.stages or another
engine; nothing imports an engine package but by name (Hydra's ``_target_``, the schema's discovery) and the
analysis, which reads an engine's torch-free arms. docs/engines.md gives the recipe for adding one.
"""
