#include "generate/completion_server.hpp"

#include <httplib.h>

#include "common/error.hpp"

namespace meshtron::generate {

namespace {

std::string dump(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void send_error(httplib::Response& res, int status, const std::string& message,
                const std::string& type = "invalid_request_error") {
  res.status = status;
  res.set_content(dump(error_body(message, type)), "application/json");
}

}  // namespace

void CompletionJob::push(std::string piece) {
  std::lock_guard lock(mutex_);
  pending_ += piece;
  changed_.notify_all();
}

void CompletionJob::finish(int status, std::string body) {
  std::lock_guard lock(mutex_);
  status_ = status;
  pending_ += body;
  finished_ = true;
  changed_.notify_all();
}

bool CompletionJob::take(std::string& out) {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return !pending_.empty() || finished_; });
  out = std::move(pending_);
  pending_.clear();
  return !out.empty();
}

std::pair<int, std::string> CompletionJob::wait() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return finished_; });
  return {status_, std::move(pending_)};
}

CompletionServer::CompletionServer(std::function<CompletionRequest(const std::string&)> parse,
                                   nlohmann::json health)
    : parse_(std::move(parse)), health_(std::move(health)),
      http_(std::make_unique<httplib::Server>()) {
  route();
}

CompletionServer::~CompletionServer() { stop(); }

void CompletionServer::route() {
  http_->Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(dump(health_), "application/json");
  });
  http_->Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    std::shared_ptr<CompletionJob> job;
    try {
      job = std::make_shared<CompletionJob>(parse_(req.body));
    } catch (const BadRequest& e) {
      return send_error(res, 400, e.what());
    }
    {
      std::lock_guard lock(mutex_);
      if (stopping_) return send_error(res, 503, "the server is stopping", "server_error");
      jobs_.push_back(job);
      queued_.notify_one();
    }
    if (!job->request().stream) {
      auto [status, body] = job->wait();
      res.status = status;
      return res.set_content(body, "application/json");
    }
    res.set_chunked_content_provider("text/event-stream", [job](std::size_t, httplib::DataSink& sink) {
      std::string piece;
      if (!job->take(piece)) {
        sink.done();
        return true;
      }
      return piece.empty() || sink.write(piece.data(), piece.size());
    });
  });
  http_->set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (res.body.empty())
      send_error(res, res.status, "no route " + req.method + " " + req.path);
  });
}

int CompletionServer::start(const std::string& host, int port) {
  const int bound = port == 0 ? http_->bind_to_any_port(host) : (http_->bind_to_port(host, port) ? port : -1);
  MESH_REQUIRE(bound > 0, "serve: cannot listen on " << host << ":" << port
                              << " (in use, or not an address of this host)");
  thread_ = std::thread([this] { http_->listen_after_bind(); });
  return bound;
}

std::shared_ptr<CompletionJob> CompletionServer::next_job(std::chrono::milliseconds wait) {
  std::unique_lock lock(mutex_);
  if (!queued_.wait_for(lock, wait, [&] { return !jobs_.empty(); })) return nullptr;
  auto job = jobs_.front();
  jobs_.pop_front();
  return job;
}

void CompletionServer::stop() {
  {
    std::lock_guard lock(mutex_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
    for (auto& job : jobs_)
      job->finish(503, dump(error_body("the server is stopping", "server_error")));
    jobs_.clear();
  }
  http_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace meshtron::generate
