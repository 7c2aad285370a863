// go-peers: the reference implementations the tests compare Ichor with, in
// one binary so that their shared Go dependencies are compiled once. Each
// subcommand lives in its own file and registers itself in init().
package main

import (
	"fmt"
	"os"
	"sort"
)

// A subcommand reads its input (usually stdin) and writes its verdicts to
// stdout; it returns the process exit code.
type subcommand struct {
	summary string
	run     func(args []string) int
}

var subcommands = map[string]subcommand{}

func register(name, summary string, run func(args []string) int) {
	if _, taken := subcommands[name]; taken {
		panic("go-peers: subcommand registered twice: " + name)
	}
	subcommands[name] = subcommand{summary: summary, run: run}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: go-peers SUBCOMMAND [ARGS...]")
	names := make([]string, 0, len(subcommands))
	for name := range subcommands {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		fmt.Fprintf(os.Stderr, "  %-12s %s\n", name, subcommands[name].summary)
	}
}

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	sub, ok := subcommands[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "go-peers: no subcommand %q\n", os.Args[1])
		usage()
		os.Exit(2)
	}
	os.Exit(sub.run(os.Args[2:]))
}
