// Dynamic loss scaling for fp16 mixed precision (Megatron-LM's
// DynamicGradScaler with hysteresis 1).
//
// fp16 has 5 exponent bits: gradients below ~6e-8 flush to zero. The
// backward therefore starts from dloss x scale, so every activation
// gradient is `scale` times larger, and the fp32 main_grad is multiplied by
// 1/scale before the norm and clipping. When the scaled gradients overflow
// (the global grad norm is inf/NaN) the step is skipped and the scale
// halves (never below min_scale); after growth_interval consecutive good
// steps it doubles. bf16 and fp32 share fp32's exponent range and run
// without a scaler (scale 1).
//
// Host logic only: the trainer asks scale() before the backward and calls
// update() with the step's overflow verdict, identical on every rank (the
// norm is all-reduced), so every rank's scaler stays in step.
#pragma once

namespace meshtron {

struct LossScalerConfig {
  double initial_scale = 65536.0;  ///< 2^16
  double min_scale = 1.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  long growth_interval = 1000;  ///< consecutive good steps before growing
};

class DynamicLossScaler {
 public:
  explicit DynamicLossScaler(const LossScalerConfig& config = {});

  /// Factor applied to dloss at the start of the backward.
  double scale() const { return scale_; }
  /// Factor applied to the fp32 gradients before the norm (1 / scale).
  double inverse_scale() const { return 1.0 / scale_; }

  /// Records one step's verdict: on overflow the step is counted as skipped
  /// and the scale backs off; otherwise good steps accumulate towards growth.
  void update(bool found_overflow);

  /// Sets the scale (the good-step count restarts).
  void set_scale(double scale);
  /// Restores a checkpoint's scale and good-step count, so that growth
  /// happens at the step an uninterrupted run would grow.
  void restore(double scale, long good_steps_in_a_row);

  long skipped_steps() const { return skipped_; }
  long good_steps_in_a_row() const { return good_steps_; }

 private:
  LossScalerConfig config_;
  double scale_;
  long good_steps_ = 0;
  long skipped_ = 0;
};

}  // namespace meshtron
