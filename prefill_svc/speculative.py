"""The prefill worker's speculative path: which requests ask for it, the draft's selection on
the model thread, and what the response reports."""

from __future__ import annotations

from dataclasses import dataclass

from serving import metrics
from serving.convert import duration
from serving.errors import DraftMissing, RequestError
from serving.speculative import POSITIONS_TO_PB, speculative_from_pb
from snapstream.cancel import Cancel
from snapstream.chat import ChatMessage
from snapstream.checkpoints.registry import AUTO_DRAFT, model_path
from snapstream.specprefill.pieces import Piece, Rendering, Request
from snapstream.specprefill.selector import DraftSelector, PromptTooLongForDraft, Selection
from snapstream.specprefill.settings import SpeculativeSettings
from snapstream.tokenizer import Tokenizer
from snapstream.v1 import common_pb2, prefill_pb2


@dataclass(frozen=True)
class SpeculativeJob:
    settings: SpeculativeSettings
    request: Request  # what the draft reads, in its own format
    target_view: Rendering  # the prompt as the router rendered it for the target
    keep_from_char: int | None


def job_from_request(request: prefill_pb2.PrefillRequest, selector: DraftSelector | None,
                     defaults: SpeculativeSettings) -> SpeculativeJob | None:
    """None when the request does not ask for speculative prefill; DraftMissing when it does
    and this worker has no draft model. Unset settings: ``defaults``, the worker's
    (:meth:`SpeculativeSettings.defaults_for` its target)."""
    if not request.HasField("speculative"):
        return None
    if selector is None:
        raise DraftMissing("speculative prefill: this prefill worker has no draft model; "
                           "start it with --draft-model NAME (or send no speculative settings)")
    _check_draft(request.speculative.draft_model, selector)
    prompt = request.speculative_prompt
    if not prompt.text:
        raise RequestError("speculative_prompt.text is empty: speculative prefill reads the "
                           "text", field="speculative_prompt.text")
    keep_from = prompt.keep_from_char if prompt.HasField("keep_from_char") else None
    settings = speculative_from_pb(request.speculative, defaults)
    return SpeculativeJob(settings, *_request_from_pb(prompt), keep_from)


def _check_draft(asked: str, selector: DraftSelector) -> None:
    """A request naming a draft (other than ``auto``) names this worker's: DraftMissing
    otherwise, since a worker runs the one draft it was started with."""
    if asked in ("", AUTO_DRAFT):
        return
    try:
        path = model_path(asked)
    except ValueError:  # unknown or not installed: not this worker's either
        path = None
    if path is None or selector.path is None or path.resolve() != selector.path.resolve():
        raise DraftMissing(f"speculative.draft_model {asked!r}: this prefill worker drafts with "
                           f"{selector.draft.name}; ask for {AUTO_DRAFT!r} (its draft) or send "
                           f"the request to a worker started with --draft-model {asked}")


def _request_from_pb(prompt: prefill_pb2.SpeculativePrompt) -> tuple[Request, Rendering]:
    """The request (a text prompt when no pieces come) and the target's rendering of it;
    RequestError when a piece is not where it says in the text."""
    if not prompt.pieces:
        request = Request.completion(prompt.text)
        return request, Rendering(prompt.text, (Piece(0, 0, len(prompt.text)),))
    for i, piece in enumerate(prompt.pieces):
        if prompt.text[piece.offset:piece.offset + len(piece.content)] != piece.content:
            raise RequestError(f"speculative_prompt.pieces[{i}]: its content is not at offset "
                               f"{piece.offset} of the text",
                               field=f"speculative_prompt.pieces[{i}]")
    try:
        messages = tuple(ChatMessage(p.role, p.content) for p in prompt.pieces)
    except ValueError as exc:
        raise RequestError(f"speculative_prompt.pieces: {exc}",
                           field="speculative_prompt.pieces") from None
    return Request(messages, is_chat=True), Rendering(
        prompt.text, tuple(Piece(p.offset, 0, len(p.content)) for p in prompt.pieces))


def select(selector: DraftSelector, job: SpeculativeJob, tokenizer: Tokenizer,
           prompt_ids: list[int], context_len: int, cancel: Cancel) -> Selection:
    """On the model thread: the draft's pick among ``prompt_ids`` (the router's tokens of the
    same text), at most ``context_len`` (the target's) tokens; Cancelled once ``cancel`` is
    set."""
    try:
        selection = selector.select(job.request, job.target_view, tokenizer, job.settings,
                                    job.keep_from_char, cancel)
    except PromptTooLongForDraft as exc:
        raise RequestError(f"speculative: {exc}", field="speculative") from None
    if selection.num_prompt_tokens != len(prompt_ids):
        raise RequestError(f"speculative_prompt.text has {selection.num_prompt_tokens} tokens, "
                           f"prompt_token_ids {len(prompt_ids)}: send the text they came from",
                           field="speculative_prompt.text")
    if len(selection.ids) > context_len:
        raise RequestError(f"speculative: the draft keeps {len(selection.ids)} tokens, more than "
                           f"the model's context of {context_len}: lower keep or keep_tokens",
                           field="speculative")
    metrics.DRAFT_TIME.observe(selection.draft_s)
    metrics.KEPT_SHARE.observe(selection.kept_share)
    return selection


def report(selection: Selection, target_prefill_s: float) -> common_pb2.SpeculativeReport:
    metrics.TARGET_PREFILL_TIME.observe(target_prefill_s)
    return common_pb2.SpeculativeReport(
        draft_time=duration(selection.draft_s), target_prefill_time=duration(target_prefill_s),
        kept_tokens=len(selection.ids), prompt_tokens=selection.num_prompt_tokens,
        skipped=selection.skipped, positions=POSITIONS_TO_PB[selection.position_mode])
