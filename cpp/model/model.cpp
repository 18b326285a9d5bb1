// The model: loads weights and caches from the artifact, checks a batch, and runs the decoder layers over all
// rows of the batch at once (linear layers batched; attention and the delta rule per sequence).
#include "model/model.h"

#include <algorithm>
#include <unordered_set>

#include "backend/backend.h"
#include "errors.h"
#include "model/blocks.h"

namespace ninfer {
namespace {

// The most MTP rows mtp_layer runs as single-row sequences (a verify round's catch-up is at most
// kMaxDraftTokens + 1 rows; a prompt's are more).
constexpr int64_t kMtpRowSequences = 8;

class DecoderModel final : public Model {
 public:
  DecoderModel(std::shared_ptr<const Artifact> artifact, const ModelOptions& options, std::unique_ptr<Backend> backend)
      : artifact_(std::move(artifact)), options_(options),
        config_(ModelConfig::from_json(artifact_->config(), artifact_->path())),
        weights_(load_weights(*artifact_, config_)),
        backend_(backend ? std::move(backend) : make_cpu_backend(options.threads)), scratch_(backend_->memory()) {
    check_options();
    inv_freq_ = rope_inverse_frequencies(config_.rope);
    rope_ = RopeSpec{config_.rope.pairing, config_.rope.rotary_dim, inv_freq_.data()};
    mrope_stream_ = mrope_frequency_streams(config_.rope);
    mrope_ = RopeSpec{config_.rope.pairing, config_.rope.rotary_dim, inv_freq_.data(), 3, mrope_stream_.data()};
    if (options.vision) {
      if (!config_.vision) throw EngineError(artifact_->path() + ": this model has no vision tower");
      vision_ = std::make_unique<VisionTower>(*artifact_, *config_.vision, *backend_);
    }
  }

  const ModelConfig& config() const override { return config_; }
  const ModelOptions& options() const override { return options_; }
  MemoryResource& memory() override { return backend_->memory(); }

  CacheLayout cache_layout() const override {
    CacheLayout l;
    l.kv_layers = config_.num_full_attention_layers() + (weights_.mtp ? 1 : 0);
    l.kv_heads = config_.num_kv_heads;
    l.head_dim = config_.head_dim;
    if (const auto& g = config_.linear_attention; g && config_.num_linear_attention_layers() > 0) {
      l.state_layers = config_.num_linear_attention_layers();
      const int64_t channels =
          2LL * g->num_key_heads * g->key_head_dim + int64_t(g->num_value_heads) * g->value_head_dim;
      l.conv_floats = channels * (g->conv_kernel - 1);
      l.recurrent_floats = int64_t(g->num_value_heads) * g->key_head_dim * g->value_head_dim;
    }
    return l;
  }

  void forward(std::span<const ForwardItem> batch, CachePools& pools, ForwardOutput& out) override {
    check_batch(batch, pools);
    backend_->bind_calling_thread();
    const int64_t h = config_.hidden_size;

    seqs_.clear();
    int64_t rows = 0, full_rows = 0, candidate_rows = 0, candidates = 0;
    out.vocab = config_.vocab_size;
    out.hidden_size = h;
    out.row_offset.clear();
    out.candidate_offset.assign(batch.size(), 0);
    out.all_hidden_offset.clear();
    int64_t all_hidden_rows = 0;
    for (const ForwardItem& item : batch) {
      const bool projected = !item.candidates.empty();
      if (item.step_slots.empty()) {
        seqs_.push_back({rows, item.n_tokens, item.start, item.pages.data(), item.state_slot});
      } else {  // one decode-like sequence per row, each continuing from the one before
        for (int64_t t = 0; t < item.n_tokens; ++t)
          seqs_.push_back({rows + t, 1, item.start + t, item.pages.data(), item.step_slots[size_t(t)],
                           t == 0 ? item.state_slot : item.step_slots[size_t(t - 1)]});
      }
      out.row_offset.push_back(projected ? candidate_rows++ : full_rows);
      if (projected) {
        out.candidate_offset[out.row_offset.size() - 1] = candidates;
        candidates += int64_t(item.candidates.size());
      }
      out.all_hidden_offset.push_back(item.all_hidden ? all_hidden_rows : -1);
      all_hidden_rows += item.all_hidden ? item.n_tokens : 0;
      rows += item.n_tokens;
      if (!projected) full_rows += item.all_logits ? item.n_tokens : (item.n_tokens > 0 ? 1 : 0);
    }
    const int64_t out_rows = full_rows + candidate_rows;
    // Three position streams only when an item brings M-RoPE positions; else one (text-only M-RoPE is 1-D).
    const bool three_d = std::any_of(batch.begin(), batch.end(), [](const ForwardItem& i) { return i.mrope_positions; });
    const int64_t streams = three_d ? 3 : 1;
    int64_t* positions = scratch_.positions(rows * streams);
    int64_t* out_index = scratch_.row_index(out_rows);
    float* hidden = scratch_.get(Buf::Hidden, rows * h);
    // Item by item (a verify item is several sequences in seqs_, so seqs_ does not index the batch).
    for (size_t i = 0, row0 = 0; i < batch.size(); row0 += size_t(batch[i].n_tokens), ++i) {
      const ForwardItem& item = batch[i];
      const int64_t first = int64_t(row0), n = item.n_tokens;
      for (int64_t t = 0; t < n; ++t)
        for (int64_t k = 0; k < streams; ++k)
          positions[(first + t) * streams + k] =
              item.mrope_positions ? item.mrope_positions[t * 3 + k] : item.start + t + item.position_offset;
      if (!item.candidates.empty()) out.row_offset[i] += full_rows;  // the projected rows follow the full-logit rows
      for (int64_t t = item.all_logits ? 0 : n - 1, o = out.row_offset[i]; t < n; ++t) out_index[o++] = first + t;
      backend_->embed(item.tokens, n, *weights_.embed, hidden + first * h);
      for (const EmbeddingRows& e : item.embeddings)
        backend_->memory().from_host(hidden + (first + e.first) * h, e.rows, size_t(e.count * h) * sizeof(float));
    }

    const PassContext pass{*backend_, config_, pools.kv(), pools.states(), scratch_, seqs_, positions, rows,
                           three_d ? mrope_ : rope_, options_.gdn_chunk};
    decoder_layers(pass, weights_.layers, hidden);

    const bool on_device = out.keep_on_device && !backend_->memory().host_accessible();
    out.hidden.resize(on_device && !out.hidden_to_host ? 0 : size_t(out_rows * h));
    out.logits.resize(on_device ? 0 : size_t(full_rows * config_.vocab_size));
    float* final_hidden =
        on_device ? scratch_.get(Buf::OutRows, out_rows * h) : output_buffer(out.hidden, Buf::OutRows);
    float* logits = on_device ? scratch_.get(Buf::Logits, full_rows * config_.vocab_size)
                              : output_buffer(out.logits, Buf::Logits);
    backend_->gather_rows(hidden, h, out_index, out_rows, final_hidden);
    backend_->rmsnorm(final_hidden, out_rows, h, h, weights_.final_norm.data(), pass.norm_kind(), pass.eps(),
                      final_hidden, h);
    if (full_rows > 0) backend_->linear(final_hidden, full_rows, *weights_.lm_head, logits);
    project_candidates(batch, out, final_hidden);
    out.device_logits = on_device && full_rows > 0 ? logits : nullptr;
    if (!on_device) {
      copy_output(out.hidden, final_hidden);
      copy_output(out.logits, logits);
    } else if (out.hidden_to_host) {
      backend_->memory().to_host(out.hidden.data(), final_hidden, out.hidden.size() * sizeof(float));
    }
    // After the output rows' gather: this reuses its row index.
    out.all_hidden.clear();
    if (all_hidden_rows > 0) all_hidden_out(batch, out, hidden, all_hidden_rows);
  }

  bool has_mtp() const override { return weights_.mtp.has_value(); }

  void mtp_forward(const float* hidden, const ForwardItem& item, CachePools& pools, std::vector<float>& logits,
                   std::vector<float>* normed_out) override {
    check_mtp_item(item);
    const int64_t n = item.n_tokens, h = config_.hidden_size;
    const float* normed = mtp_layer(staged_hidden(hidden, n), item.tokens, nullptr, n, item.start, item, pools);
    if (normed_out) {
      normed_out->resize(size_t(n * h));
      backend_->memory().to_host(normed_out->data(), normed, normed_out->size() * sizeof(float));
    }
    const int64_t logit_rows = item.all_logits ? n : 1;
    logits.resize(size_t(logit_rows * config_.vocab_size));
    float* out = output_buffer(logits, Buf::Logits);
    backend_->linear(normed + (n - logit_rows) * h, logit_rows, *weights_.lm_head, out);
    copy_output(logits, out);
  }

  void mtp_draft(const float* hidden, const ForwardItem& item, CachePools& pools, int32_t drafts,
                 std::vector<int32_t>& tokens) override {
    check_mtp_item(item);
    if (drafts < 0) throw EngineError("mtp_draft: drafts must be >= 0, got " + std::to_string(drafts));
    const int64_t n = item.n_tokens, h = config_.hidden_size, vocab = config_.vocab_size;
    if (drafts > 0 && item.start + n - 1 + drafts > int64_t(item.pages.size()) * kKvPageTokens)
      throw EngineError("mtp_draft: " + std::to_string(drafts) + " drafts after position " +
                        std::to_string(item.start + n - 1) + " go beyond the sequence's reserved " +
                        std::to_string(item.pages.size() * kKvPageTokens) + " tokens");
    const float* normed = mtp_layer(staged_hidden(hidden, n), item.tokens, nullptr, n, item.start, item, pools);
    // The drafts' rows of the lm-head: its shortlist when the artifact has one (the verify pass reads the whole).
    const MtpWeights& m = *weights_.mtp;
    const bool shortlist = m.draft_head != nullptr;
    const TensorView& draft_head = shortlist ? *m.draft_head : *weights_.lm_head;
    const int64_t draft_cols = shortlist ? int64_t(m.draft_vocab.size()) : vocab;
    int32_t* ids = scratch_.draft_ids(std::max(drafts, 1));
    for (int32_t j = 0; j < drafts; ++j) {
      if (j > 0) {  // the step before's output row is this step's hidden, its draft this step's token
        float* step_hidden = scratch_.get(Buf::MtpHidden, h);
        const int64_t last_row = j == 1 ? n - 1 : 0;
        backend_->gather_rows(normed, h, &last_row, 1, step_hidden);
        normed = mtp_layer(step_hidden, nullptr, ids + j - 1, 1, item.start + n - 1 + j, item, pools);
      }
      float* logits = scratch_.get(Buf::Logits, draft_cols);
      backend_->linear(normed + (j == 0 ? n - 1 : 0) * h, 1, draft_head, logits);
      backend_->argmax_rows(logits, 1, draft_cols, ids + j, shortlist ? m.draft_vocab.data() : nullptr);
    }
    tokens.resize(size_t(drafts));
    if (drafts > 0) backend_->memory().to_host(tokens.data(), ids, size_t(drafts) * sizeof(int32_t));
  }

  const VisionTower* vision() const override { return vision_.get(); }

  void encode_vision(std::span<const float> patches, std::span<const VisionGrid> grids,
                     std::vector<float>& out) override {
    if (!vision_) throw EngineError("the vision tower is not loaded (start with --vision)");
    vision_->encode(patches, grids, out);
  }

 private:
  void check_options() const {
    const ModelOptions& o = options_;
    if (o.threads < 0) throw EngineError("threads must be >= 0 (0: all cores)");
    if (o.gdn_chunk <= 0) throw EngineError("gdn_chunk must be positive, got " + std::to_string(o.gdn_chunk));
  }

  // Where an op writes a host-side output: the vector itself when the backend works in host memory, else a
  // scratch buffer that copy_output brings back.
  float* output_buffer(std::vector<float>& host, Buf staging) {
    return backend_->memory().host_accessible() ? host.data() : scratch_.get(staging, int64_t(host.size()));
  }
  void copy_output(std::vector<float>& host, const float* written) {
    if (written != host.data()) backend_->memory().to_host(host.data(), written, host.size() * sizeof(float));
  }

  // Every row of the all_hidden items, final-normed, into out.all_hidden (the MTP head reads a prompt's rows).
  void all_hidden_out(std::span<const ForwardItem> batch, ForwardOutput& out, const float* hidden, int64_t rows) {
    const int64_t h = config_.hidden_size;
    out.all_hidden.resize(size_t(rows * h));
    int64_t* index = scratch_.row_index(rows);
    for (size_t i = 0, o = 0, row0 = 0; i < batch.size(); row0 += size_t(batch[i].n_tokens), ++i)
      if (batch[i].all_hidden)
        for (int64_t t = 0; t < batch[i].n_tokens; ++t) index[o++] = int64_t(row0) + t;
    float* rows_out = scratch_.get(Buf::MtpHidden, rows * h);
    backend_->gather_rows(hidden, h, index, rows, rows_out);
    const NormKind kind = config_.norm_offset ? NormKind::Offset : NormKind::Plain;
    backend_->rmsnorm(rows_out, rows, h, h, weights_.final_norm.data(), kind, float(config_.rms_norm_eps), rows_out, h);
    backend_->memory().to_host(out.all_hidden.data(), rows_out, out.all_hidden.size() * sizeof(float));
  }

  // The candidate logits of the items that asked for them: their lm-head rows gathered (embed reads a row in any
  // encoding) and dotted with the item's final-normed hidden row; k rows of the head instead of the vocabulary.
  void project_candidates(std::span<const ForwardItem> batch, ForwardOutput& out, const float* final_hidden) {
    int64_t total = 0, widest = 0;
    for (const ForwardItem& item : batch) {
      total += int64_t(item.candidates.size());
      widest = std::max(widest, int64_t(item.candidates.size()));
    }
    out.candidate_logits.assign(size_t(total), 0.0f);
    if (total == 0) return;
    const int64_t h = config_.hidden_size;
    float* rows = scratch_.get(Buf::CandidateRows, widest * h);
    float* dots = output_buffer(out.candidate_logits, Buf::CandidateLogits);
    for (size_t i = 0; i < batch.size(); ++i) {
      const std::span<const int32_t> ids = batch[i].candidates;
      if (ids.empty()) continue;
      const int64_t k = int64_t(ids.size());
      backend_->embed(ids.data(), k, *weights_.lm_head, rows);
      backend_->row_dots(rows, k, h, final_hidden + out.row_offset[i] * h, dots + out.candidate_offset[i]);
    }
    copy_output(out.candidate_logits, dots);
  }

  void check_mtp_item(const ForwardItem& item) const {
    if (!weights_.mtp) throw EngineError(artifact_->path() + ": this model has no MTP head");
    const int64_t n = item.n_tokens, start = item.start;
    if (n <= 0 || start < 0) throw EngineError("mtp_forward needs n > 0 rows at a start position >= 0");
    if (start + n > int64_t(item.pages.size()) * kKvPageTokens)
      throw EngineError("mtp_forward at positions " + std::to_string(start) + ".." + std::to_string(start + n - 1) +
                        " beyond the sequence's reserved " + std::to_string(item.pages.size() * kKvPageTokens) +
                        " tokens");
    check_tokens(item.tokens, n);
  }

  // The target's hidden rows (host memory) where the backend's ops read them (an op of the pass: a drafting pass
  // replayed as a CUDA graph takes its own rows).
  const float* staged_hidden(const float* hidden, int64_t n) {
    backend_->bind_calling_thread();
    if (backend_->memory().host_accessible()) return hidden;
    float* staged = scratch_.get(Buf::MtpHidden, n * config_.hidden_size);
    backend_->upload_floats(hidden, n * config_.hidden_size, staged);
    return staged;
  }

  // The MTP layer over n rows at positions start..: u = fc([norm(embed(next token)) | norm(hidden)]), one decoder
  // layer (its KV in item's pages), mtp.norm. `hidden_rows` are in the backend's memory; the next tokens are host
  // ids or, for a draft step, `resident_ids` in the backend's memory (the step before's argmax). Returns the normed
  // rows (Buf::OutRows).
  const float* mtp_layer(const float* hidden_rows, const int32_t* host_ids, const int32_t* resident_ids, int64_t n,
                         int64_t start, const ForwardItem& item, CachePools& pools) {
    const MtpWeights& m = *weights_.mtp;
    const int64_t h = config_.hidden_size;
    const NormKind kind = config_.norm_offset ? NormKind::Offset : NormKind::Plain;
    const float eps = float(config_.rms_norm_eps);
    float* embedded = scratch_.get(Buf::MtpEmbed, n * h);
    float* concat = scratch_.get(Buf::MtpConcat, n * 2 * h);
    float* u = scratch_.get(Buf::Hidden, n * h);
    if (resident_ids)
      backend_->embed_resident_ids(resident_ids, n, *weights_.embed, embedded);
    else
      backend_->embed(host_ids, n, *weights_.embed, embedded);
    backend_->rmsnorm(embedded, n, h, h, m.pre_fc_norm_embedding.data(), kind, eps, concat, 2 * h);
    backend_->rmsnorm(hidden_rows, n, h, h, m.pre_fc_norm_hidden.data(), kind, eps, concat + h, 2 * h);
    backend_->linear(concat, n, *m.fc, u);

    int64_t* positions = scratch_.positions(n);
    for (int64_t t = 0; t < n; ++t) positions[t] = start + t + item.position_offset;
    // A round's few rows run as single-row sequences, a verify pass's layout: the decode attention, which a CUDA
    // graph of the drafting replays at any position (Model::mtp_draft). A prompt's rows run as one sequence (the
    // prefill attention: thousands of rows). Each row attends to the positions up to its own either way.
    seqs_.clear();
    if (n <= kMtpRowSequences) {
      for (int64_t t = 0; t < n; ++t)
        seqs_.push_back(SequenceRows{t, 1, start + t, item.pages.data(), item.state_slot});
    } else {
      seqs_.push_back(SequenceRows{0, n, start, item.pages.data(), item.state_slot});
    }
    const PassContext pass{*backend_, config_, pools.kv(), pools.states(), scratch_, seqs_, positions, n, rope_,
                           options_.gdn_chunk};
    decoder_layers(pass, std::span(&m.layer, 1), u);

    float* normed = scratch_.get(Buf::OutRows, n * h);
    backend_->rmsnorm(u, n, h, h, m.norm.data(), kind, eps, normed, h);
    return normed;
  }

  void check_tokens(const int32_t* tokens, int64_t n) const {
    for (int64_t i = 0; i < n; ++i)
      if (tokens[i] < 0 || tokens[i] >= config_.vocab_size)
        throw EngineError("token id " + std::to_string(tokens[i]) + " (at index " + std::to_string(i) +
                          ") is outside the vocabulary of " + std::to_string(config_.vocab_size) +
                          " tokens [0, " + std::to_string(config_.vocab_size) + ")");
  }

  // Everything that can be wrong with a batch is found here, before any cache changes.
  void check_batch(std::span<const ForwardItem> batch, CachePools& pools) const {
    // Two items writing one page (or one state slot) would overwrite each other: the same sequence twice, or a
    // fork whose partial page was not copied. Shared read-only pages (a common prefix) are fine.
    std::unordered_set<int32_t> written_pages, slots;
    const bool stateful = config_.num_linear_attention_layers() > 0;
    if (pools.kv().layers() != cache_layout().kv_layers || (stateful && !pools.states()))
      throw EngineError("the cache pools were not built to this model's cache layout");
    for (const ForwardItem& item : batch) {
      if (item.n_tokens < 0 || item.start < 0) throw EngineError("negative token count or start position");
      check_tokens(item.tokens, item.n_tokens);
      if (!item.candidates.empty()) {
        if (item.n_tokens < 1 || item.all_logits)
          throw EngineError("a candidate readout needs at least one new token and only its last row");
        check_tokens(item.candidates.data(), int64_t(item.candidates.size()));
      }
      const int64_t end = item.start + item.n_tokens;
      if (end > int64_t(item.pages.size()) * kKvPageTokens)
        throw EngineError("sequence of " + std::to_string(end) + " tokens has only " +
                          std::to_string(item.pages.size() * kKvPageTokens) + " tokens of pages");
      for (int64_t p = item.start / kKvPageTokens; p * kKvPageTokens < end; ++p)
        if (!written_pages.insert(item.pages[size_t(p)]).second)
          throw EngineError("two sequences of one batch write KV page " + std::to_string(item.pages[size_t(p)]));
      if (stateful && item.state_slot < 0) throw EngineError("sequence has no state slot");
      if (item.mrope_positions && config_.rope.mrope_section.empty())
        throw EngineError("M-RoPE positions given to a model without M-RoPE");
      for (const EmbeddingRows& e : item.embeddings)
        if (e.first < 0 || e.count < 0 || e.first + e.count > item.n_tokens || !e.rows)
          throw EngineError("embedding rows [" + std::to_string(e.first) + ", " + std::to_string(e.first + e.count) +
                            ") outside the item's " + std::to_string(item.n_tokens) + " tokens");
      if (stateful && !slots.insert(item.state_slot).second)
        throw EngineError("two sequences of one batch use state slot " + std::to_string(item.state_slot));
      if (!item.step_slots.empty() && int64_t(item.step_slots.size()) != item.n_tokens)
        throw EngineError("a verify item of " + std::to_string(item.n_tokens) + " tokens has " +
                          std::to_string(item.step_slots.size()) + " step slots");
      if (!item.step_slots.empty() && (!item.candidates.empty() || !item.embeddings.empty() || item.mrope_positions))
        throw EngineError("a verify item takes draft tokens only (no candidates, media rows or M-RoPE positions)");
      for (int32_t slot : item.step_slots)
        if (stateful && !slots.insert(slot).second)
          throw EngineError("two sequences of one batch use state slot " + std::to_string(slot));
    }
  }

  std::shared_ptr<const Artifact> artifact_;
  ModelOptions options_;
  ModelConfig config_;
  ModelWeights weights_;
  std::unique_ptr<Backend> backend_;
  std::vector<float> inv_freq_;
  RopeSpec rope_;
  std::vector<uint8_t> mrope_stream_;  // empty without M-RoPE (mrope_ is then never used)
  RopeSpec mrope_;
  std::unique_ptr<VisionTower> vision_;
  Scratch scratch_;
  std::vector<SequenceRows> seqs_;
};

}  // namespace

std::unique_ptr<Model> Model::load(std::shared_ptr<const Artifact> artifact, const ModelOptions& options,
                                   std::unique_ptr<Backend> backend) {
  return std::make_unique<DecoderModel>(std::move(artifact), options, std::move(backend));
}

}  // namespace ninfer
