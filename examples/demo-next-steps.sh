# What to do after `make demo` (it prints these lines at its end); run from the repository's top directory.
# A decision through the routers' virtual address (keepalived holds 10.79.0.10 on one of the lab's two routers; port
# 8000, their fleet endpoint), routed to the model the body names (d3-mini):
curl -sS http://10.79.0.10:8000/v1/systemone -H 'Content-Type: application/json' -d @examples/decision-request.json
# The fleet status (one row per instance, then the router's view of every model):
ansible-playbook playbooks/status.yml -i inventories/lab
# Roll out the lab registry's next nightly (tags: nightly, nightly-next, nightly-broken), then back:
ansible-playbook playbooks/rollout.yml -i inventories/lab -e d3_image_name=docker.io/vllm/vllm-openai:nightly-next
ansible-playbook playbooks/rollout.yml -i inventories/lab -e d3_image_name=docker.io/vllm/vllm-openai:nightly
