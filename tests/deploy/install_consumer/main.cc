// Outside consumer of the installed normd::client: LayerNorm of [1, 2, 3]
// and a Fit, printed for tests/install_test.py to check.
//
// Usage: consumer HOST:PORT
#include <cstdio>

#include "client/client.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: consumer HOST:PORT\n");
    return 2;
  }
  auto client = normd::client::NormdClient::Connect(argv[1]);
  normd::v1::NormalizeRequest request;
  request.set_mode(normd::v1::LAYER_NORM);
  request.mutable_input()->set_dtype(normd::v1::FLOAT64);
  request.mutable_input()->add_shape(3);
  for (double v : {1.0, 2.0, 3.0}) request.mutable_input()->add_values(v);
  auto normalized = client->Normalize(request);
  if (!normalized.ok()) {
    std::fprintf(stderr, "Normalize: %s\n",
                 normalized.status().ToString().c_str());
    return 1;
  }
  for (double v : normalized->output().values()) std::printf("%.17g\n", v);

  normd::v1::FitRequest fit;
  fit.set_model("consumer");
  *fit.mutable_input() = request.input();
  fit.mutable_input()->clear_shape();
  fit.mutable_input()->add_shape(3);
  fit.mutable_input()->add_shape(1);
  auto fitted = client->Fit(fit);
  if (!fitted.ok()) {
    std::fprintf(stderr, "Fit: %s\n", fitted.status().ToString().c_str());
    return 1;
  }
  std::printf("fit mean %.17g batches %lld\n", fitted->model().mean(0),
              static_cast<long long>(fitted->model().num_batches_tracked()));
  return 0;
}
