// Command ssa-prune-peer runs the manifests step of `talosctl upgrade-k8s`
// (Talos 1.13 and later) as a peer for Ichor's tests: the inventory-backed
// server-side apply of the Go module github.com/siderolabs/go-kubernetes
// (package kubernetes/ssa, at the version pinned in tools/versions.env), with
// Talos's field manager, Talos's inventory ConfigMap and talosctl's defaults
// (inventory policy AdoptIfNoInventory, prune on):
//
//	ssa-prune-peer --kubeconfig FILE [--no-prune] [--wait-timeout 30s] MANIFEST...
//
// Each MANIFEST is a multi-document YAML file; together they are the bootstrap
// manifests the step applies. Every object in the inventory that is not among
// them is pruned when its owning-inventory annotation allows it. The program
// prints one line per change, "<action> <object>", and exits 1 on an error.
// talosctl then waits for the rollout of what it applied; the peer does not,
// since the prune is what Ichor's tests judge.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/siderolabs/go-kubernetes/kubernetes/ssa"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/tools/clientcmd"
)

// Talos's names for the manifests step (its machinery constants
// KubernetesFieldManagerName, KubernetesInventoryNamespace and
// KubernetesBootstrapManifestsInventoryName).
const (
	fieldManager       = "talos"
	inventoryNamespace = "kube-system"
	inventoryName      = "talos-bootstrap-manifests-inventory"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "ssa-prune-peer: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the cluster to apply to (required)")
	noPrune := flag.Bool("no-prune", false, "apply without pruning (talosctl upgrade-k8s --manifests-no-prune)")
	waitTimeout := flag.Duration("wait-timeout", 30*time.Second, "how long to wait for staged objects (CRDs, namespaces) to become ready")
	flag.Parse()

	if *kubeconfig == "" || flag.NArg() == 0 {
		return errors.New("usage: ssa-prune-peer --kubeconfig FILE [--no-prune] [--wait-timeout D] MANIFEST...")
	}

	var objects []*unstructured.Unstructured

	for _, path := range flag.Args() {
		objs, err := readManifests(path)
		if err != nil {
			return fmt.Errorf("reading %s: %w", path, err)
		}

		objects = append(objects, objs...)
	}

	restConfig, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return fmt.Errorf("loading kubeconfig %s: %w", *kubeconfig, err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	manager, err := ssa.NewManager(ctx, restConfig, fieldManager, inventoryNamespace, inventoryName)
	if err != nil {
		return fmt.Errorf("building the SSA manager: %w", err)
	}
	defer manager.Close()

	changes, err := manager.Apply(ctx, objects, ssa.ApplyOptions{
		InventoryPolicy: ssa.InventoryPolicyAdoptIfNoInventory,
		NoPrune:         *noPrune,
		WaitTimeout:     *waitTimeout,
	})

	for _, change := range changes {
		fmt.Printf("%s %s\n", change.Action, change.ObjMetadata.String())
	}

	if err != nil {
		return fmt.Errorf("applying the manifests: %w", err)
	}

	return nil
}

// readManifests decodes every non-empty document of a multi-document YAML file.
func readManifests(path string) ([]*unstructured.Unstructured, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}

	decoder := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)

	var objects []*unstructured.Unstructured

	for {
		var doc map[string]any

		if err := decoder.Decode(&doc); err != nil {
			if errors.Is(err, io.EOF) {
				return objects, nil
			}

			return nil, err
		}

		if len(doc) == 0 {
			continue
		}

		objects = append(objects, &unstructured.Unstructured{Object: doc})
	}
}
