// The HTTP front of `meshtron serve` on rank 0 (cpp-httplib): its threads
// parse and validate requests and queue them as jobs; the engine (the main
// thread, the only one that calls MPI) takes one job at a time, runs it on
// every rank and hands the answer back through the job.
//
//   GET  /health          200 {"status": "ok", ...the model and its layout}
//   POST /v1/completions  200 completion | text/event-stream chunks | 4xx error
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "generate/completions.hpp"

namespace httplib {
class Server;
}

namespace meshtron::generate {

/// One request between an HTTP thread and the engine.
class CompletionJob {
 public:
  explicit CompletionJob(CompletionRequest r) : request_(std::move(r)) {}
  const CompletionRequest& request() const { return request_; }
  /// Engine: one piece of a streamed answer ("data: ...\n\n").
  void push(std::string piece);
  /// Engine: the end; `body` is the whole answer (not streamed) or the
  /// last pieces of a stream.
  void finish(int status, std::string body);
  /// HTTP thread: the pieces so far (blocks until one comes or the end);
  /// false once the end has come and everything was taken.
  bool take(std::string& out);
  /// HTTP thread: waits for the end; its status and body.
  std::pair<int, std::string> wait();

 private:
  CompletionRequest request_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::string pending_;
  bool finished_ = false;
  int status_ = 200;
};

class CompletionServer {
 public:
  /// `parse`: body -> request (throws BadRequest); `health`: the body of GET /health.
  CompletionServer(std::function<CompletionRequest(const std::string&)> parse,
                   nlohmann::json health);
  ~CompletionServer();
  /// Binds host:port (0 = a free port) and serves on a thread of its own;
  /// the bound port. A port in use is a UserError.
  int start(const std::string& host, int port);
  /// The next queued job, or null after `wait` without one.
  std::shared_ptr<CompletionJob> next_job(std::chrono::milliseconds wait);
  /// Stops accepting, answers queued jobs with 503 and joins the thread.
  void stop();

 private:
  void route();
  std::function<CompletionRequest(const std::string&)> parse_;
  nlohmann::json health_;
  std::unique_ptr<httplib::Server> http_;
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable queued_;
  std::deque<std::shared_ptr<CompletionJob>> jobs_;
  bool stopping_ = false;
};

}  // namespace meshtron::generate
