"""Server pieces that need no running server: tool-call parsing, grammar constraints, templates, CLI errors."""
import json
import subprocess
import sys

import jsonschema
import numpy as np
import pytest
from transformers import AutoTokenizer

from sluice_contracts.json_depth import MAX_JSON_DEPTH
from sluice_runtime.server.chat_template import ChatTemplate
from sluice_runtime.server.errors import APIError, _location
from sluice_runtime.server.json_limits import UnsafeJSON, loads
from sluice_runtime.server.protocol import Tool
from sluice_runtime.server.structured_output import GrammarCompiler
from sluice_runtime.server.tool_calls import ToolCallParser, tools_system_prompt

WEATHER = Tool.model_validate({"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                                          "required": ["city"], "additionalProperties": False}}})
ADD = Tool.model_validate({"type": "function", "function": {
    "name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                                  "required": ["a", "b"], "additionalProperties": False}}})
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                           "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
                                           "score": {"type": "number"}},
          "required": ["name", "tags", "score"], "additionalProperties": False}


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    return AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="module")
def grammars(tokenizer):
    return GrammarCompiler(tokenizer, len(tokenizer), [tokenizer.eos_token_id])


OUTPUT = ('Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
          '<tool_call>\n{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}\n</tool_call>')


def parse_in_pieces(text: str, size: int):
    parser = ToolCallParser([WEATHER, ADD])
    shown = []
    for i in range(0, len(text), size):
        piece, _ = parser.feed(text[i:i + size])
        shown.append(piece)
    tail, _ = parser.finish()
    return "".join(shown) + tail, parser.calls, shown


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_tool_calls_parse_the_same_whatever_the_chunking(size):
    content, calls, shown = parse_in_pieces(OUTPUT, size)
    assert content.strip() == "Sure."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Oslo"}),
                                                                  ("add", {"a": 1, "b": 2})]
    assert all(c.id.startswith("call_") for c in calls) and calls[0].id != calls[1].id
    assert not any("<" in piece for piece in shown), "a partial marker leaked into the content"


def test_blocks_that_are_not_valid_calls_stay_content():
    for text in ('<tool_call>\n{"name": "unknown", "arguments": {}}\n</tool_call>',
                 "<tool_call>\nnot json\n</tool_call>", "a < b and <tool", "<tool_call>{\"name\": \"add\""):
        content, calls, _ = parse_in_pieces(text, 3)
        assert calls == [] and content == text


def test_unclosed_but_complete_call_still_counts():
    content, calls, _ = parse_in_pieces('<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}', 4)
    assert content == "" and calls[0].name == "add"


@pytest.mark.parametrize("cut, name, arguments, streamed", [
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Os', "get_weather", '{"city": "Os', True),
    ('<tool_call>\n{"name": "add", "arguments": ', "add", "", False),
    ('<tool_call>\n{"name": "get_wea', None, None, False),
    ("<tool_", None, None, False),
])
def test_a_forced_call_cut_short_is_a_truncated_call_never_markup(cut, name, arguments, streamed):
    parser = ToolCallParser([WEATHER, ADD], forced=True)
    shown, _ = parser.feed(cut)
    tail, _ = parser.finish()
    assert shown + tail == ""
    assert [(c.name, c.arguments) for c in parser.calls] == ([(name, arguments)] if name else [])
    content, calls, _ = parse_in_pieces(cut, 3)
    if streamed:
        # Its arguments had begun, so a streamed client already has the call: it stays one, cut short.
        assert (content, [(c.name, c.arguments) for c in calls]) == ("", [(name, arguments)])
    else:
        # Without a forced tool_choice the same text is the model's own words, kept as content.
        assert (content, calls) == (cut, [])


def stream_in_pieces(text: str, size: int, forced: bool = False):
    """What a streamed client assembles from the parser's deltas, and after how many pieces each call began."""
    parser = ToolCallParser([WEATHER, ADD], forced)
    assembled: dict[int, dict] = {}
    pieces = [text[i:i + size] for i in range(0, len(text), size)]
    for n, piece in enumerate(pieces + [None]):
        _, deltas = parser.feed(piece) if piece is not None else parser.finish()
        for d in deltas:
            if d.new:
                assert d.index not in assembled, "a call was announced twice"
                assembled[d.index] = {"id": d.call.id, "name": d.call.name, "arguments": "", "began": n,
                                      "pieces": 0}
            assembled[d.index]["arguments"] += d.arguments
            assembled[d.index]["pieces"] += bool(d.arguments)
    return parser, [assembled[i] for i in sorted(assembled)], len(pieces)


@pytest.mark.parametrize("size", [1, 2, 5, 1000])
def test_streamed_call_deltas_add_up_to_the_calls(size):
    parser, streamed, _ = stream_in_pieces(OUTPUT, size)
    assert [(s["id"], s["name"], s["arguments"]) for s in streamed] == [
        (c.id, c.name, c.arguments) for c in parser.calls]
    assert [json.loads(s["arguments"]) for s in streamed] == [{"city": "Oslo"}, {"a": 1, "b": 2}]


def test_arguments_stream_while_they_are_written():
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Reykjavik and more"}}\n</tool_call>'
    _, (call,), pieces = stream_in_pieces(text, 2)
    # The call is announced as soon as its name and argument key are read, well before its arguments end.
    assert call["began"] <= text.index('{"city"') // 2 + 1
    assert call["pieces"] >= len('{"city": "Reykjavik and more"}') // 2 - 1
    assert call["arguments"] == '{"city": "Reykjavik and more"}'


def test_string_encoded_arguments_stream_decoded():
    text = ('<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"S\\u00e3o \\ud83d\\ude00\\"}"}'
            '\n</tool_call>after')
    for size in (1, 3, 1000):
        parser, (call,), _ = stream_in_pieces(text, size)
        assert json.loads(call["arguments"]) == {"city": "S\u00e3o \U0001F600"}
        assert call["arguments"] == parser.calls[0].arguments
    assert parse_in_pieces(text, 4)[0] == "after"


def test_a_call_closed_before_its_arguments_end_is_cut_there():
    text = '<tool_call>\n{"name": "add", "arguments": {"a": 1</tool_call> and then'
    content, calls, _ = parse_in_pieces(text, 3)
    assert [(c.name, c.arguments) for c in calls] == [("add", '{"a": 1')] and content == " and then"


def test_calls_in_another_layout_are_read_whole():
    text = '<tool_call>\n{"arguments": {"a": 1, "b": 2}, "name": "add"}\n</tool_call>'
    _, (call,), pieces = stream_in_pieces(text, 4)
    assert call["name"] == "add" and json.loads(call["arguments"]) == {"a": 1, "b": 2}


def test_tools_prompt_lists_every_tool_and_the_format():
    prompt = tools_system_prompt([WEATHER, ADD])
    assert '"name": "get_weather"' in prompt and '"name": "add"' in prompt and "<tool_call>" in prompt


def random_walk(grammars, grammar: str, tokenizer, seed: int, limit: int = 400) -> str:
    """Sample uniformly among the allowed tokens: the worst possible 'model'."""
    rng = np.random.default_rng(seed)
    constraint = grammars.constraint(grammar)
    tokens = []
    while not constraint.is_finished() and len(tokens) < limit:
        allowed = np.flatnonzero(constraint.allowed_tokens())
        assert len(allowed) > 0
        # Prefer short tokens a little so strings close before the limit.
        token = int(rng.choice(allowed[:64])) if rng.random() < 0.9 else int(rng.choice(allowed))
        constraint.accept_token(token)
        if token == tokenizer.eos_token_id:
            break
        tokens.append(token)
    assert len(tokens) < limit
    return tokenizer.decode(tokens)


@pytest.mark.parametrize("seed", range(6))
def test_json_schema_constraint_only_allows_valid_documents(grammars, tokenizer, seed):
    text = random_walk(grammars, grammars.json_schema(PERSON, "response_format"), tokenizer, seed)
    jsonschema.validate(json.loads(text), PERSON)


@pytest.mark.parametrize("seed", range(4))
def test_tool_call_constraint_only_allows_valid_calls(grammars, tokenizer, seed):
    text = random_walk(grammars, grammars.tool_call([WEATHER, ADD], None), tokenizer, seed)
    parser = ToolCallParser([WEATHER, ADD])
    content, _ = parser.feed(text)
    tail, _ = parser.finish()
    assert (content + tail).strip() == "" and len(parser.calls) == 1
    call = parser.calls[0]
    schema = {"get_weather": WEATHER, "add": ADD}[call.name].function.parameters
    jsonschema.validate(json.loads(call.arguments), schema)


def test_named_tool_constraint_forces_that_tool(grammars, tokenizer):
    text = random_walk(grammars, grammars.tool_call([WEATHER, ADD], "add"), tokenizer, 0)
    assert json.loads(text.split("\n")[1])["name"] == "add"


def test_forked_constraints_are_independent(grammars, tokenizer):
    first = grammars.constraint(grammars.json_object())
    second = first.fork()
    for token in tokenizer.encode('{"a": 1}', add_special_tokens=False):
        first.accept_token(token)
    assert first.allowed_tokens()[tokenizer.eos_token_id]
    assert not second.allowed_tokens()[tokenizer.eos_token_id]


def test_invalid_schema_is_a_400(grammars):
    with pytest.raises(APIError) as info:
        grammars.json_schema({"type": "nonsense"}, "response_format.json_schema.schema")
    assert info.value.status == 400 and info.value.param == "response_format.json_schema.schema"


def test_chat_template_override_and_version(tokenizer, tmp_path):
    default = ChatTemplate.load(tokenizer, None)
    assert default.renders_tools is False and len(default.version) == 12
    custom = tmp_path / "template.jinja"
    custom.write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
                      "{% if tools %}TOOLS{% endif %}{% if add_generation_prompt %}[assistant] {% endif %}")
    template = ChatTemplate.load(tokenizer, str(custom))
    assert template.version != default.version and template.renders_tools
    assert template.render([{"role": "user", "content": "hi"}]) == "[user] hi\n[assistant] "
    with pytest.raises(ValueError, match="does not exist"):
        ChatTemplate.load(tokenizer, str(tmp_path / "missing.jinja"))
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}")
    with pytest.raises(ValueError, match="not valid Jinja"):
        ChatTemplate.load(tokenizer, str(broken))


def test_error_locations_name_the_parameter():
    assert _location(("body", "messages", 0, "role")) == "messages[0].role"
    assert _location(("body", "stop", "list[str]", 3)) == "stop[3]"
    assert _location(("body", "tool_choice", "NamedToolChoice", "function")) == "tool_choice.function"
    assert _location(("body",)) is None


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "sluice_runtime.cli", *args], capture_output=True, text=True,
                          timeout=120)


def test_cli_refuses_bad_flags_with_one_clear_line():
    bad_flag = run_cli("serve", "--block-size", "3")
    assert bad_flag.returncode == 2 and "block size must be a power of two" in bad_flag.stderr
    bad_model = run_cli("serve", "--model", "/no/such/model")
    assert bad_model.returncode == 1 and "Traceback" not in bad_model.stderr
    assert "/no/such/model" in bad_model.stderr
    bad_body = run_cli("serve", "--max-body-bytes", "lots")
    assert bad_body.returncode == 2 and "cannot parse memory size" in bad_body.stderr


@pytest.mark.parametrize("open_, close", [("[", "]"), ('{"a": ', "}")])
def test_the_runtime_takes_exactly_the_nesting_the_gateway_admits(open_, close):
    def nested(levels: int) -> str:
        return open_ * levels + ("1" if close == "}" else "") + close * levels

    loads(nested(MAX_JSON_DEPTH))
    with pytest.raises(UnsafeJSON) as refused:
        loads(nested(MAX_JSON_DEPTH + 1))
    assert refused.value.code == "json_too_deep"
