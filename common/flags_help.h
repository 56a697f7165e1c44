// `--help` for paramd's programs: the usage line and the program's own flags (not Abseil's),
// each with its help text and default, on standard output, and exit status 0. Abseil's own
// --help lists only flags defined in a file named after the program and exits 1. `--version`
// prints the program's name and paramd's version (common/version.h), exit status 0.
#pragma once

namespace paramd {

// Call before absl::ParseCommandLine (after absl::SetProgramUsageMessage): prints and exits
// when argv asks for help (--help, -help, --helpfull, -h) or the version (--version), else
// returns.
void HandleHelpFlag(int argc, char** argv);

}  // namespace paramd
