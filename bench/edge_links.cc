#include "bench/edge_links.h"

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace tophat::bench {

CommandResult RunCommand(const std::vector<std::string>& argv) {
  CommandResult result;
  int pipe_fds[2];
  if (argv.empty() || pipe(pipe_fds) != 0) return result;
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(pipe_fds[1], STDOUT_FILENO);
    dup2(pipe_fds[1], STDERR_FILENO);
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    std::vector<char*> args;
    for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  close(pipe_fds[1]);
  std::array<char, 4096> buffer;
  ssize_t n = 0;
  while ((n = read(pipe_fds[0], buffer.data(), buffer.size())) > 0) {
    result.output.append(buffer.data(), static_cast<size_t>(n));
  }
  close(pipe_fds[0]);
  int status = 0;
  if (pid > 0 && waitpid(pid, &status, 0) == pid) {
    result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  return result;
}

namespace {

absl::Status RunScript(const std::filesystem::path& script, std::vector<std::string> args,
                       std::string* output = nullptr) {
  args.insert(args.begin(), {"bash", script.string()});
  const CommandResult result = RunCommand(args);
  if (output != nullptr) *output = result.output;
  if (result.exit_code != 0) {
    return absl::UnavailableError(absl::StrCat(
        script.string(), " ", args[2], ": ",
        std::string(absl::StripAsciiWhitespace(result.output)), " (exit ", result.exit_code,
        ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<EdgeLinks>> EdgeLinks::Create(const std::filesystem::path& script,
                                                             int devices) {
  if (!std::filesystem::exists(script)) {
    return absl::NotFoundError(absl::StrCat(script.string(), ": no such script"));
  }
  if (absl::Status status = RunScript(script, {"check"}); !status.ok()) return status;
  // Leftovers from a run that was killed would make `up` fail.
  RunScript(script, {"down"}).IgnoreError();
  if (absl::Status status = RunScript(script, {"up", std::to_string(devices)}); !status.ok()) {
    RunScript(script, {"down"}).IgnoreError();
    return status;
  }
  return std::unique_ptr<EdgeLinks>(new EdgeLinks(script, devices));
}

EdgeLinks::~EdgeLinks() { RunScript(script_, {"down"}).IgnoreError(); }

absl::StatusOr<bool> EdgeLinks::Shape(int index, double uplink_bytes_per_second,
                                      double downlink_bytes_per_second, double one_way_delay_s) {
  std::string output;
  const auto whole = [](double x) { return std::to_string(std::llround(x)); };
  absl::Status status =
      RunScript(script_,
                {"shape", std::to_string(index), whole(uplink_bytes_per_second),
                 whole(downlink_bytes_per_second), absl::StrCat(one_way_delay_s * 1e3)},
                &output);
  if (!status.ok()) return status;
  return output.find("delay: kernel") != std::string::npos;
}

std::string EdgeLinks::Stats(int index) const {
  std::string output;
  absl::Status status = RunScript(script_, {"stats", std::to_string(index)}, &output);
  if (!status.ok()) return status.ToString();
  return output;
}

std::string EdgeLinks::HostAddress(int index) { return absl::StrCat("10.77.", index, ".1"); }
std::string EdgeLinks::DeviceAddress(int index) { return absl::StrCat("10.77.", index, ".2"); }

std::vector<std::string> EdgeLinks::ExecPrefix(int index) {
  // The caller execs without a PATH search.
  std::string ip = "ip";
  for (const char* path : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (std::filesystem::exists(path)) {
      ip = path;
      break;
    }
  }
  return {ip, "netns", "exec", absl::StrCat("tophat-dev", index)};
}

}  // namespace tophat::bench
