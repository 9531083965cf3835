"""Which part of a record is the document: ``--text-field`` as a dotted path, several fields joined,
or a conversation rendered with the tokenizer's own chat template.

- ``--text-field meta.body`` reads ``record["meta"]["body"]`` (a key that itself holds the dots,
  ``record["meta.body"]``, wins if present);
- ``--text-field prompt --text-field completion`` joins the fields' texts with ``JOIN``;
- a field that holds a conversation, a list of ``{"role": ..., "content": ...}`` messages (the
  ``messages`` of chat fine-tuning sets), is rendered with the tokenizer's chat template, which is
  what a chat trainer tokenizes; the counts and embeddings are of those tokens. As TRL's SFT trainer
  does: several conversation fields (``prompt`` + ``completion``) are one conversation, ShareGPT's
  ``from``/``value`` keys are read as ``role``/``content``, and a record's ``tools`` and
  ``chat_template_kwargs`` are passed to the template.

A record's fingerprint (what the caches are keyed by) covers the extracted value itself (a
conversation as JSON, keys in the record's order and nulls kept: what the template is given), so editing any
selected field invalidates just that record.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from dataclasses import field as dataclass_field

from .errors import UserError

JOIN = "\n"
DEFAULT_TEXT_FIELD = "text"  # --text-field when none is given
MISSING = object()  # a field a record does not have


@dataclass(frozen=True)
class Conversation:
    """A list of chat messages, kept as JSON as the record holds them (hashable, one fingerprint each), and where the
    record is (``file:line``) for a template that refuses it."""

    messages_json: str
    where: str = dataclass_field(default="", compare=False)
    # its roles outside KNOWN_ROLES, found while the messages are checked (reading the JSON again took half as
    # long as parsing the record)
    unknown_roles: frozenset = dataclass_field(default=frozenset(), compare=False)
    # the record's TEMPLATE_ARGUMENTS as JSON ("" where it has none: a conversation's fingerprint is
    # then its messages' alone, as before they were read)
    arguments_json: str = ""
    # what a chat trainer may read otherwise than this tool does (``KWARGS_NULL`` ...), found with the messages
    trainer_notes: frozenset = dataclass_field(default=frozenset(), compare=False)

    @property
    def messages(self) -> list[dict]:
        return json.loads(self.messages_json)

    @property
    def template_arguments(self) -> dict:
        """What the record adds to the chat template's call: ``tools=...`` and its ``chat_template_kwargs``."""
        if not self.arguments_json:
            return {}
        arguments = json.loads(self.arguments_json)
        return {**({"tools": arguments["tools"]} if "tools" in arguments else {}),
                **arguments.get("chat_template_kwargs", {})}


# A conversation record's top-level fields that a chat trainer passes to the template beside the messages (TRL's
# SFT trainer: ``tools``, a list or its JSON text, and ``chat_template_kwargs``, merged into the call).
TEMPLATE_ARGUMENTS = ("tools", "chat_template_kwargs")


def lookup(record: dict, path: str):
    """The value at dotted ``path`` (an exact key first), or a sentinel when absent."""
    if path in record:
        return record[path]
    value = record
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return MISSING
        value = value[part]
    return value


# Roles chat templates are written for (OpenAI's and the Hugging Face templates' names); another (ShareGPT's
# human/gpt, a typo) is rendered however the template renders an unknown role, often as a role of that name.
KNOWN_ROLES = frozenset({"system", "user", "assistant", "tool", "developer", "function", "ipython"})
NO_ROLES = frozenset()


def shown_keys(record: dict) -> str:
    """A record's first keys, each on the message's one line (a key with a newline or tab is JSON-quoted)."""
    return ", ".join(key if key.isprintable() else json.dumps(key) for key in sorted(map(str, record))[:10]) or "none"


# What TRL's SFT trainer reads otherwise than this tool: a record's chat_template_kwargs null (a column some records
# lack is read as null for them), given (to find records lacking it beside them), and ShareGPT turns (from/value)
# in a field not named "conversations", the only one it converts.
KWARGS_NULL, KWARGS_GIVEN, KWARGS_ABSENT = "chat_template_kwargs null", "chat_template_kwargs given", "no chat_template_kwargs"
SHAREGPT_ELSEWHERE = "ShareGPT"
SHAREGPT_FIELD = "conversations"


def _conversation(parts: list[tuple[str, list]], where: str, record: dict) -> Conversation:
    """The messages of every conversation field in ``parts`` ((field, messages), in --text-field order) as one
    conversation, with the record's template arguments."""
    unknown, messages, notes = [], [], set()
    for field, value in parts:
        if not value:
            raise UserError(f"{where}: field '{field}' is an empty conversation")
        for i, message in enumerate(map(_decoded_message, value)):
            read = _from_sharegpt(message)
            # (a message whose from/value are null beside its role/content, as a Parquet column of both kinds
            # gives every row, is no ShareGPT turn)
            if read is not message and message.get("from") is not None and field != SHAREGPT_FIELD:
                notes.add(SHAREGPT_ELSEWHERE)
            messages.append(_checked_message(read, where, f"{field}[{i}]"))
            if messages[-1]["role"] not in KNOWN_ROLES:
                unknown.append(messages[-1]["role"])
    notes.add(KWARGS_ABSENT if "chat_template_kwargs" not in record else
              KWARGS_NULL if record["chat_template_kwargs"] is None else KWARGS_GIVEN)
    return Conversation(_as_read(messages), where, frozenset(unknown) if unknown else NO_ROLES,
                        _template_arguments(record, where, prompt_and_completion=len(parts) > 1),
                        frozenset(notes))


def _as_read(value) -> str:
    """``value`` as JSON, its keys in the record's order and its nulls kept: what the template is given (a trainer
    passes the objects as its loader decodes them, and a template printing one through ``tojson`` prints both), so
    what the fingerprint covers."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _from_sharegpt(message):
    """A ShareGPT message (``from``/``value``) with the keys chat templates read, renamed as TRL renames them; its
    roles (human, gpt) are kept, and said as unknown roles. Where a message also has ``role``/``content`` as nulls
    (a Parquet column of both kinds of message gives each every key), those are left out."""
    if isinstance(message, dict) and message.get("role") is None and message.get("content") is None and \
            message.get("from") is not None and "value" in message:
        return {("role" if key == "from" else "content" if key == "value" else key): item
                for key, item in message.items() if key not in ("role", "content")}
    if isinstance(message, dict) and message.get("from", 0) is None and message.get("value", 0) is None:
        return {key: item for key, item in message.items() if key not in ("from", "value")}
    return message


def _checked_message(message, where: str, name: str) -> dict:
    if not isinstance(message, dict) or "content" not in message or "role" not in message:
        has = f" (its keys: {shown_keys(message)})" if isinstance(message, dict) else f" ({kind_of(message)})"
        raise UserError(f"{where}: field '{name}' is not a {{\"role\": ..., \"content\": ...}} object{has}"
                        + (_NO_CONTENT_HINT if isinstance(message, dict) and "tool_calls" in message else ""))
    if not isinstance(message["role"], str) or not isinstance(message["content"], str):
        value = message["content"] if isinstance(message["role"], str) else message["role"]
        what = "content" if isinstance(message["role"], str) else "role"
        raise UserError(f"{where}: field '{name}' has a {what} that is {kind_of(value)}, expected a string"
                        + (_CONTENT_HINTS.get(json_type(value), "") if what == "content" else ""))
    return message


def _template_arguments(record: dict, where: str, prompt_and_completion: bool = False) -> str:
    """The record's ``TEMPLATE_ARGUMENTS`` (null ones left out), as JSON; "" where it has none. Its
    chat_template_kwargs are merged into the call as a chat trainer merges them (over ``tools``); those that
    trainer's call gives itself, and those that change only a tokenizing call's ids, are refused."""
    arguments = {}
    tools = record.get("tools")
    if isinstance(tools, str):  # TRL decodes a tools column stored as JSON text
        try:
            tools = json.loads(tools)
        except ValueError:
            raise UserError(f"{where}: field 'tools' is a string that is not JSON (a chat trainer decodes it to pass "
                            "the tools to the chat template)") from None
    if tools is not None:
        arguments["tools"] = tools
    options = record.get("chat_template_kwargs")
    if options is not None and not isinstance(options, dict):
        raise UserError(f"{where}: field 'chat_template_kwargs' is {kind_of(options)}, expected an object "
                        "(the chat template's keyword arguments)")
    given = set(options or {})
    clashing = sorted(given & (_TRAINER_SETS | (_TRAINER_SETS_FOR_A_PROMPT if prompt_and_completion else set())))
    if clashing:
        raise UserError(f"{where}: field 'chat_template_kwargs' sets {', '.join(map(repr, clashing))}, which a chat "
                        "trainer's call sets itself (TRL's SFTTrainer fails on it: an argument given twice"
                        + ("; for a prompt and completion it renders the prompt with add_generation_prompt=True, "
                           "which continue_final_message cannot go with"
                           if clashing[0] in _TRAINER_SETS_FOR_A_PROMPT else "") + "); leave it out of the record")
    tokenizing = sorted(given & _TOKENIZING_ONLY)
    if tokenizing:
        raise UserError(f"{where}: field 'chat_template_kwargs' sets {', '.join(map(repr, tokenizing))}, which "
                        "changes the ids of a call that tokenizes (a trainer's), not the text this tool renders and "
                        "counts: the counts would not be the trainer's; leave it out of the record")
    if options:
        arguments["chat_template_kwargs"] = options
    return _as_read(arguments) if arguments else ""


# A record's chat_template_kwargs reach the template as TRL's SFTTrainer passes them: merged over the chat template
# and the tools (so they may set those), into a call that gives these itself (a keyword twice: a TypeError there),
# and, for a prompt and completion, also renders the prompt alone with add_generation_prompt=True.
_TRAINER_SETS = frozenset({"conversation", "tokenize", "return_dict", "return_assistant_tokens_mask"})
# For a prompt and completion TRL renders the prompt alone with add_generation_prompt=True (SFTTrainer), or sets
# both itself from the prompt's last role (its apply_chat_template): continue_final_message clashes either way.
_TRAINER_SETS_FOR_A_PROMPT = frozenset({"add_generation_prompt", "continue_final_message"})
# apply_chat_template's arguments that change the ids of a tokenizing call only (truncated, padded), which the
# rendered text and its counted tokens would not show.
_TOKENIZING_ONLY = frozenset({"padding", "truncation", "max_length", "return_tensors", "tokenizer_kwargs"})


def _decoded_message(message):
    """A message stored as a JSON string, as its object: the datasets library saves messages whose keys differ
    (some with tool calls) as ``List(Json())``, each message a JSON string in the Arrow file, which it decodes
    when read; so is it read here."""
    if isinstance(message, str) and message[:1] == "{":
        try:
            decoded = json.loads(message)
        except ValueError:
            return message
        return decoded if isinstance(decoded, dict) else message
    return message


# How to turn a message's content into the string a chat template renders, by what it is instead.
_CONTENT_HINTS = {
    "null": " (a turn that only calls tools: give it the content \"\"; its tool_calls stay as they are)",
    "array": " (content parts: join their texts into one string; images and audio have no tokens here)",
}
_NO_CONTENT_HINT = " (a turn that only calls tools, as OpenAI's API writes it: give it the content \"\"; its tool_calls stay)"


def is_encoded_conversation(text: str) -> bool:
    """``text`` is a conversation written as a JSON string: a list of role/content messages (a Parquet column of
    JSON, a dataset saved with its messages serialised). Read as plain text, its tokens are the JSON's."""
    if '"role"' not in text[:400]:
        return False
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return isinstance(value, list) and bool(value) and all(
        isinstance(message, dict) and "role" in message and "content" in message for message in value)


def unknown_roles(document: str | Conversation) -> frozenset[str]:
    """The roles of a conversation outside ``KNOWN_ROLES`` (a plain text has none)."""
    return document.unknown_roles if isinstance(document, Conversation) else NO_ROLES


def trainer_notes(document: str | Conversation) -> frozenset[str]:
    """What a chat trainer reads otherwise in a conversation (``KWARGS_NULL`` ...; a plain text has none)."""
    return document.trainer_notes if isinstance(document, Conversation) else frozenset()


def missing_field_hint(record: dict) -> str:
    """For a record without the text field: where it holds a conversation under another key (a chat source in a
    mix of plain ones), how to read it; else ""."""
    for key, value in record.items():
        if isinstance(value, list) and value and isinstance(value[0], dict) and ("role" in value[0] or
                                                                                 "from" in value[0]):
            return (f"; its '{key}' holds a conversation, which --text-field {key} reads (a run reads one field: "
                    "give chat and plain records one field name, or curate them apart)")
    return ""


def extract(record: dict, fields: tuple[str, ...], where, keys_text) -> str | Conversation:
    """The document of ``record``: one field's text or conversation, or several fields' texts joined.

    ``where()`` names the record in errors (``file:line``), called only on an error;
    ``keys_text(record)`` lists its keys.
    """
    parts, conversations = [], []
    for field in fields:
        value = lookup(record, field)
        if value is MISSING:
            raise UserError(f"{where()}: no field '{field}' (this record has keys: {keys_text(record)}); choose the "
                            "text field with --text-field (a dotted path such as meta.body reads nested objects)"
                            + missing_field_hint(record))
        if isinstance(value, str):
            parts.append(field)
        elif isinstance(value, list):
            conversations.append((field, value))
        else:
            raise UserError(f"{where()}: field '{field}' is {kind_of(value)}, expected a string "
                            "(or a conversation: a list of role/content messages)")
    if conversations and parts:
        raise UserError(f"{where()}: field '{conversations[0][0]}' is a conversation and '{parts[0]}' a text; fields "
                        "read together must be all texts (joined) or all conversations (prompt + completion messages)")
    if conversations:
        return _conversation(conversations, where(), record)
    texts = [lookup(record, field) for field in parts]
    return texts[0] if len(texts) == 1 else JOIN.join(texts)


def as_tuple(text_field: str | tuple[str, ...]) -> tuple[str, ...]:
    return (text_field,) if isinstance(text_field, str) else tuple(text_field)


def cache_key(text_field: str | tuple[str, ...]) -> str:
    """The fields as cache keys name them: one field as itself (the keys of earlier runs), several joined by "+"."""
    return "+".join(as_tuple(text_field))


def fingerprint_text(value: str | Conversation) -> str:
    """The text a fingerprint covers: the document itself, or the conversation's JSON (and its template
    arguments')."""
    if isinstance(value, Conversation):
        return value.messages_json + ("\0" + value.arguments_json if value.arguments_json else "")
    return value


def render(value: str | Conversation, tokenizer) -> str:
    """The text the trainer tokenizes: the document, or the conversation through the chat template."""
    if isinstance(value, Conversation):
        return tokenizer.render_chat(value.messages, value.where, value.template_arguments)
    return value


def json_type(value) -> str:
    """A JSON value's type in JSON's words (object, array, null, ...), for error lines."""
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number",
            type(None): "null"}.get(type(value), type(value).__name__)


def kind_of(value) -> str:
    """What a value is, for error lines: "a JSON number", or for what a Parquet column may hold that JSON has no
    word for, its own ("binary data (bytes)", "a datetime"): "a JSON bytes" read as nonsense. A missing value is
    "null", which JSON and Parquet both call it (a Parquet null is no "JSON null")."""
    if value is None:
        return "null"
    if isinstance(value, dict | list | str | bool | int | float):
        return f"a JSON {json_type(value)}"
    if isinstance(value, bytes | bytearray | memoryview):
        return "binary data (bytes)"
    if isinstance(value, tuple):  # what Arrow gives a map's entries as: (key, value) pairs
        return "an Arrow map entry, a (key, value) pair"
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def plain_text(value: str | Conversation) -> str:
    """The words of a document, for reports: the text, or a conversation's message contents."""
    if isinstance(value, Conversation):
        return "\n".join(message["content"] for message in value.messages)
    return value
