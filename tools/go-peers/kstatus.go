// kstatus: how Flux (`wait: true`, health checks) and Helm 4 (`--wait`)
// judge an object, by the library they use: sigs.k8s.io/cli-utils
// pkg/kstatus/status. Reads YAML documents or JSON (an object, a List, or
// one object per document) from the files named, or stdin, and prints one
// JSON line per object: kind, namespace, name, status, message.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/yaml"
)

func init() {
	register("kstatus", "kstatus verdict (cli-utils) per object read from FILES or stdin, as JSON lines", runKstatus)
}

type verdict struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
	Status    string `json:"status"`
	Message   string `json:"message"`
}

func runKstatus(args []string) int {
	inputs := []io.Reader{os.Stdin}
	if len(args) > 0 {
		inputs = nil
		for _, path := range args {
			f, err := os.Open(path)
			if err != nil {
				fmt.Fprintf(os.Stderr, "kstatus: %v\n", err)
				return 1
			}
			defer f.Close()
			inputs = append(inputs, f)
		}
	}
	out := json.NewEncoder(os.Stdout)
	for _, in := range inputs {
		objects, err := readObjects(in)
		if err != nil {
			fmt.Fprintf(os.Stderr, "kstatus: %v\n", err)
			return 1
		}
		for _, u := range objects {
			res, err := status.Compute(u)
			if err != nil {
				fmt.Fprintf(os.Stderr, "kstatus: %s %s/%s: %v\n", u.GetKind(), u.GetNamespace(), u.GetName(), err)
				return 1
			}
			_ = out.Encode(verdict{
				Kind:      u.GetKind(),
				Namespace: u.GetNamespace(),
				Name:      u.GetName(),
				Status:    res.Status.String(),
				Message:   res.Message,
			})
		}
	}
	return 0
}

// readObjects decodes every document of r. Each goes YAML -> JSON ->
// Unstructured.UnmarshalJSON, which reads numbers as int64: kstatus reads
// metadata.generation and status.observedGeneration with NestedInt64 and
// fails on the float64 that encoding/json would give.
func readObjects(r io.Reader) ([]*unstructured.Unstructured, error) {
	reader := utilyaml.NewYAMLReader(bufio.NewReader(r))
	var objects []*unstructured.Unstructured
	for {
		doc, err := reader.Read()
		if err == io.EOF {
			return objects, nil
		}
		if err != nil {
			return nil, fmt.Errorf("reading a document: %w", err)
		}
		js, err := yaml.YAMLToJSON(doc)
		if err != nil {
			return nil, fmt.Errorf("converting a document to JSON: %w", err)
		}
		if string(js) == "null" {
			continue
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(js); err != nil {
			return nil, fmt.Errorf("decoding an object: %w", err)
		}
		if u.IsList() {
			list, err := u.ToList()
			if err != nil {
				return nil, fmt.Errorf("decoding a list: %w", err)
			}
			for i := range list.Items {
				objects = append(objects, &list.Items[i])
			}
			continue
		}
		objects = append(objects, u)
	}
}
