#include "freeride/tasks/serve_connections.h"

#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/timer.h"
#include "freeride/tasks/serve_openai.h"

namespace freeride::serve {
namespace {

// The inode of socket `fd` (its /proc/self/fd link reads "socket:[N]"); 0 for anything else.
ino_t SocketInode(int fd) {
  char path[64], link[64];
  std::snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(path, link, sizeof(link) - 1);
  if (n <= 0) return 0;
  link[n] = '\0';
  unsigned long long inode = 0;
  return std::sscanf(link, "socket:[%llu]", &inode) == 1 ? static_cast<ino_t>(inode) : 0;
}

// Whether `local` (a socket's own address) is on `listening` (the listening socket's, which may
// be the wildcard address: then any address of this machine on its port).
bool OnListeningAddress(const sockaddr_storage& listening, const sockaddr_storage& local) {
  if (listening.ss_family != local.ss_family) return false;
  if (listening.ss_family == AF_INET) {
    const auto& l = reinterpret_cast<const sockaddr_in&>(listening);
    const auto& s = reinterpret_cast<const sockaddr_in&>(local);
    return l.sin_port == s.sin_port &&
           (l.sin_addr.s_addr == htonl(INADDR_ANY) || l.sin_addr.s_addr == s.sin_addr.s_addr);
  }
  if (listening.ss_family == AF_INET6) {
    const auto& l = reinterpret_cast<const sockaddr_in6&>(listening);
    const auto& s = reinterpret_cast<const sockaddr_in6&>(local);
    return l.sin6_port == s.sin6_port &&
           (IN6_IS_ADDR_UNSPECIFIED(&l.sin6_addr) ||
            std::memcmp(&l.sin6_addr, &s.sin6_addr, sizeof(in6_addr)) == 0);
  }
  return false;
}

const char* Reason(int status) {
  switch (status) {
    case 408:
      return "Request Timeout";
    case 429:
      return "Too Many Requests";
    default:
      return "Service Unavailable";
  }
}

}  // namespace

thread_local ConnectionPool* ConnectionPool::current_pool_ = nullptr;
thread_local std::shared_ptr<ConnectionPool::Connection> ConnectionPool::current_;

std::string RawErrorResponse(int status, const std::string& message, const std::string& type) {
  const std::string body = ErrorBody({status, message, type, "", type});
  return absl::StrCat("HTTP/1.1 ", status, " ", Reason(status),
                      "\r\nContent-Type: application/json\r\nContent-Length: ", body.size(),
                      status == 429 ? "\r\nRetry-After: 1" : "", "\r\nConnection: close\r\n\r\n",
                      body);
}

ConnectionPool::ConnectionPool(int threads, int listen_fd, double read_timeout_s,
                               std::function<void()> on_refused)
    : threads_(threads), read_timeout_s_(read_timeout_s), on_refused_(std::move(on_refused)) {
  socklen_t size = sizeof(listen_address_);
  if (getsockname(listen_fd, reinterpret_cast<sockaddr*>(&listen_address_), &size) != 0) {
    listen_address_.ss_family = AF_UNSPEC;  // no connection will be told: none gets a deadline
  }
  for (int i = 0; i < threads_; ++i) workers_.emplace_back([this] { Work(); });
  watchdog_ = std::thread([this] { Watch(); });
}

ConnectionPool::~ConnectionPool() { shutdown(); }

std::shared_ptr<ConnectionPool::Connection> ConnectionPool::Identify() {
  std::set<ino_t> known;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [inode, unused] : connections_) known.insert(inode);
  }
  std::set<ino_t> not_ours;
  std::shared_ptr<Connection> found;
  int candidates = 0;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return nullptr;
  while (const dirent* entry = readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    const int fd = std::atoi(entry->d_name);
    const ino_t inode = SocketInode(fd);
    if (inode == 0 || known.count(inode) > 0) continue;
    if (not_ours_.count(inode) > 0) {
      not_ours.insert(inode);
      continue;
    }
    sockaddr_storage local{}, peer{};
    socklen_t local_size = sizeof(local), peer_size = sizeof(peer);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_size) == 0 &&
        OnListeningAddress(listen_address_, local) &&
        getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_size) == 0) {
      ++candidates;
      found = std::make_shared<Connection>();
      found->fd = fd;
      found->inode = inode;
    } else {
      not_ours.insert(inode);
    }
  }
  closedir(dir);
  not_ours_ = std::move(not_ours);
  // Exactly one by construction (see the header); anything else is left untimed rather than
  // risk timing the wrong socket.
  return candidates == 1 ? found : nullptr;
}

void ConnectionPool::enqueue(std::function<void()> fn) {
  std::shared_ptr<Connection> connection = Identify();
  std::unique_lock<std::mutex> lock(mu_);
  if (connection && busy_ >= threads_) {
    lock.unlock();
    // `fn` is dropped unrun: the socket is this pool's to close, and cpp-httplib holds it
    // nowhere else.
    Refuse(*connection);
    if (on_refused_) on_refused_();
    return;
  }
  if (connection) connections_[connection->inode] = connection;
  ++busy_;
  jobs_.push_back({std::move(fn), std::move(connection)});
  work_.notify_one();
}

void ConnectionPool::Refuse(const Connection& c) {
  const std::string response =
      RawErrorResponse(429, "every connection thread is busy; retry later", "rate_limit_exceeded");
  send(c.fd, response.data(), response.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  ::shutdown(c.fd, SHUT_WR);
  // Closing with unread bytes would reset the connection, and the client could lose the 429:
  // what the request has sent so far is read and dropped first (a client still sending after
  // the answer is reset, as by any server that closes).
  char sink[4096];
  for (int i = 0; i < 64 && recv(c.fd, sink, sizeof(sink), MSG_DONTWAIT) > 0; ++i) {
  }
  close(c.fd);
}

void ConnectionPool::Answer(const Connection& c, const std::string& response) {
  const int fd = fcntl(c.fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return;  // closed meanwhile
  struct stat st {};
  if (fstat(fd, &st) == 0 && st.st_ino == c.inode) {
    send(fd, response.data(), response.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    ::shutdown(fd, SHUT_RDWR);  // the serving thread's read ends
  }
  close(fd);
}

void ConnectionPool::Work() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_.wait(lock, [this] { return !jobs_.empty() || stopping_; });
      if (jobs_.empty()) return;  // stopping, and every job taken
      job = std::move(jobs_.front());
      jobs_.pop_front();
      if (job.connection) {
        job.connection->taken_s = MonotonicSeconds();
        watch_.notify_one();
      }
    }
    current_pool_ = this;
    current_ = job.connection;
    job.fn();  // serves the connection and closes its socket
    current_ = nullptr;
    std::lock_guard<std::mutex> lock(mu_);
    if (job.connection) connections_.erase(job.connection->inode);
    --busy_;
  }
}

void ConnectionPool::Watch() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!workers_done_) {
    const double now = MonotonicSeconds();
    double next = now + 3600;
    std::vector<std::shared_ptr<Connection>> late;
    for (const auto& [inode, c] : connections_) {
      if (c->answered || c->taken_s == 0) continue;
      const double deadline = c->taken_s + read_timeout_s_;
      if (stopping_ || deadline <= now) {
        c->answered = true;
        late.push_back(c);
      } else {
        next = std::min(next, deadline);
      }
    }
    if (!late.empty()) {
      const bool stopping = stopping_;
      lock.unlock();
      const std::string response =
          stopping ? RawErrorResponse(503, "the server is stopping", "unavailable")
                   : RawErrorResponse(408,
                                      absl::StrCat("the request did not arrive whole within ",
                                                   read_timeout_s_, " s (args.read_timeout_s)"),
                                      "timeout");
      for (const std::shared_ptr<Connection>& c : late) Answer(*c, response);
      lock.lock();
      continue;
    }
    watch_.wait_for(lock, std::chrono::duration<double>(next - now));
  }
}

void ConnectionPool::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (workers_.empty()) return;  // done already
    stopping_ = true;
  }
  work_.notify_all();
  watch_.notify_all();
  for (std::thread& t : workers_) t.join();
  workers_.clear();
  {
    std::lock_guard<std::mutex> lock(mu_);
    workers_done_ = true;
  }
  watch_.notify_all();
  watchdog_.join();
}

int ConnectionPool::EnterHandler() {
  if (current_pool_ == nullptr || !current_) return -1;
  std::lock_guard<std::mutex> lock(current_pool_->mu_);
  current_->answered = true;
  return current_->fd;
}

}  // namespace freeride::serve
