"""The platform's shared-storage KV connector, run inside vLLM (never imported by the platform): vLLM's
ExampleConnector with two changes a disaggregated endpoint needs (docs/disaggregation.md, "The connectors").

- **The key holds the request's cache_salt.** ExampleConnector names a prompt's folder by its token ids alone, so a
  prompt one tenant prefilled was loaded for another tenant's identical prompt. Here the salt joins the ids in the
  folder's hash (as multi-modal hashes already do), on the scheduler's lookups and in the metadata the workers
  save and load by.
- **A folder is published whole.** ExampleConnector writes each layer's file into the final folder as the layer runs,
  and a lookup that finds the folder loads every layer: a folder caught half-written (a prefill engine killed
  mid-step, or the same prompt looked up while it is being stored) made the reading engine exit. Here a step's
  layers are written into a private folder beside it, renamed into place once the step has saved them all.
- **A folder is claimed before it is read, and a decode replica consumes it.** The worker renames a folder it is
  about to load to a private name (atomic), checks that every layer's file is there, loads, and then deletes it (a
  ``kv_consumer``: the hand-off is done) or renames it back (any other role: it may be handed on). A folder gone
  before the claim (another replica consumed it, the platform's sweep removed it) or found incomplete is reported
  as a failed load (``get_block_ids_with_load_errors``): vLLM's ``kv_load_failure_policy`` "recompute" computes the
  prompt, where ExampleConnector's worker raised and the engine exited. What nobody consumes is removed after a TTL
  by the platform (docs/disaggregation.md, "Cleaning the hand-off folders").

vLLM loads it by ``kv_connector_module_path`` (``capacity.runtimes.vllm.kv_transfer_config``); the launch environment
puts this directory on the engine's import path.
"""

from __future__ import annotations

import os
import shutil
import uuid

from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import (
    ExampleConnector,
    ExampleConnectorMetadata,
)

SALT_TAG = "infercap-cache-salt:"


def _salt_tags(salt) -> list[str]:
    return [SALT_TAG + salt] if salt else []


class InfercapSharedStorageConnector(ExampleConnector):
    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self._salts: dict[str, str] = {}  # scheduler side: request id -> its cache_salt
        self._saving = False  # worker side: inside save_kv_layer
        self._partial: dict[str, str] = {}  # worker side: this step's private folder -> its final name
        self._claimed: dict[str, str] = {}  # worker side: a folder being loaded -> the private name it was claimed as
        self._load_errors: set[int] = set()  # worker side: blocks whose KV could not be loaded this step
        self._consume = self._kv_transfer_config.kv_role == "kv_consumer"

    # -- scheduler side: the salt joins the key -------------------------------------------------------------
    def _tags(self, request) -> list[str]:
        return [f.identifier for f in request.mm_features] + _salt_tags(getattr(request, "cache_salt", None))

    def _found_match_for_request(self, request) -> bool:
        return self._found_match_for_prompt(list(request.prompt_token_ids or []), self._tags(request))

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        self._salts[request.request_id] = getattr(request, "cache_salt", None) or ""
        return super().get_num_new_matched_tokens(request, num_computed_tokens)

    def request_finished(self, request, block_ids):
        self._salts.pop(request.request_id, None)
        return super().request_finished(request, block_ids)

    def build_connector_meta(self, scheduler_output):
        """ExampleConnector's, with each request's salt among the hashes its folder is named by."""
        meta = ExampleConnectorMetadata()
        total_need_load = 0
        for new_req in scheduler_output.scheduled_new_reqs:
            token_ids = new_req.prompt_token_ids or []
            tags = [f.identifier for f in new_req.mm_features] + _salt_tags(self._salts.get(new_req.req_id))
            if new_req.req_id in self._requests_need_load:
                meta.add_request(token_ids, new_req.block_ids[0], self._block_size, False, tags)
                total_need_load += 1
            elif not self._found_match_for_prompt(token_ids, tags):
                meta.add_request(token_ids, new_req.block_ids[0], self._block_size, True, tags)
        cached_reqs = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached_reqs.req_ids):
            if req_id not in cached_reqs.resumed_req_ids or req_id not in self._requests_need_load:
                continue
            request = self._requests_need_load[req_id]
            total_tokens = cached_reqs.num_computed_tokens[i] + scheduler_output.num_scheduled_tokens[req_id]
            block_ids = cached_reqs.new_block_ids[i][0]
            meta.add_request(
                request.all_token_ids[:total_tokens], block_ids, self._block_size, False, self._tags(request)
            )
            total_need_load += 1
        assert total_need_load == len(self._requests_need_load)
        self._requests_need_load.clear()
        return meta

    # -- worker side: a folder appears whole ----------------------------------------------------------------
    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs) -> None:
        self._saving = True
        try:
            super().save_kv_layer(layer_name, kv_layer, attn_metadata, **kwargs)
        finally:
            self._saving = False

    def _generate_foldername_debug(self, token_ids, mm_hashes, create_folder=False) -> str:
        final = super()._generate_foldername_debug(token_ids, mm_hashes, create_folder=False)
        if not self._saving:
            return self._claimed.get(final, final)
        partial = next((p for p, f in self._partial.items() if f == final), None)
        if partial is None:
            partial = f"{final}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            self._partial[partial] = final
        if create_folder:
            os.makedirs(partial, exist_ok=True)
        return partial

    def wait_for_save(self) -> None:
        for partial, final in self._partial.items():
            try:
                os.rename(partial, final)  # atomic; a folder already there (another engine's) stays
            except OSError:
                shutil.rmtree(partial, ignore_errors=True)
        self._partial.clear()

    # -- worker side: a folder is claimed, loaded whole or not at all, then consumed ------------------------
    def _layer_files(self, forward_context) -> set[str]:
        layers = forward_context.no_compile_layers
        return {
            f"{name}.safetensors" for name, layer in layers.items() if getattr(layer, "kv_cache", None) is not None
        }

    def _claim(self, request, expected: set[str]) -> bool:
        """Rename the request's folder to a private name; False (nothing claimed) when it is gone or incomplete."""
        final = super()._generate_foldername_debug(request.token_ids, request.mm_hashes, create_folder=False)
        claimed = f"{final}.loading-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            os.rename(final, claimed)
        except OSError:
            return False
        try:
            complete = expected <= set(os.listdir(claimed))
        except OSError:
            complete = False
        if not complete:
            shutil.rmtree(claimed, ignore_errors=True)  # it would fail every reader: remove it
            return False
        self._claimed[final] = claimed
        return True

    def start_load_kv(self, forward_context, **kwargs) -> None:
        metadata = self._get_connector_metadata()
        if forward_context.attn_metadata is None:
            return super().start_load_kv(forward_context, **kwargs)
        expected = self._layer_files(forward_context)
        kept = []
        for request in metadata.requests:
            if request.is_store or self._claim(request, expected):
                kept.append(request)
            else:
                self._load_errors.update((request.slot_mapping // self._block_size).tolist())
        metadata.requests = kept
        try:
            super().start_load_kv(forward_context, **kwargs)
        finally:
            self._release_claims()

    def _release_claims(self) -> None:
        for final, claimed in self._claimed.items():
            if self._consume:
                shutil.rmtree(claimed, ignore_errors=True)
                continue
            try:
                os.rename(claimed, final)  # handed on; a folder stored there meanwhile stays
            except OSError:
                shutil.rmtree(claimed, ignore_errors=True)
        self._claimed.clear()

    def get_block_ids_with_load_errors(self) -> set[int]:
        failed, self._load_errors = self._load_errors, set()
        return failed
