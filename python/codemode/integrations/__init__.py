"""Adapters: codemode's model-facing tools as the agent frameworks define tools.

Each module wraps one framework (an optional extra, imported only by its module):

    codemode.integrations.openai_agents  `agents.FunctionTool`s          codemode[openai-agents]
    codemode.integrations.pydantic_ai    a `FunctionToolset`             codemode[pydantic-ai]
    codemode.integrations.langchain      `StructuredTool`s               codemode[langchain]
    codemode.integrations.anthropic      tools for the tool runner       codemode[anthropic]

Every adapter takes a `Session` and a surface (``code`` by default: ``exec`` and ``wait``), turns
each `Session.model_tools` definition into the framework's tool, runs a call with
`Session.handle_async` (or `handle` where the framework calls tools synchronously) and answers
with `codemode.rendering.render`: compact JSON, a cell's images as the framework's images, and a
failed cell as the framework's tool error where it has one. The schemas are the surface's own;
a framework that enforces OpenAI strict mode gets it only for the schemas that pass it
(`codemode.surfaces.strict_problem`), as ``exec``'s and ``wait``'s do.
"""
