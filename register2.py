import requests, json
keys=json.load(open('/tmp/breaker/keys.json'))
A=keys['alpha']; B="http://127.0.0.1:28001"
out=json.load(open('/tmp/breaker/agents.json'))
for name,cap,port in (("rlagent","test.rl",29103),("budagent","test.budget",29104)):
    d={"agent_id":name,"version":"1.0.0","description":"x","namespace":"default",
     "reach":{"protocol":"http","endpoint":f"http://127.0.0.1:{port}/","weight":100},
     "liveness":{"ttl_seconds":300,"heartbeat_interval_seconds":60},
     "capabilities":[{"id":cap,"description":"Echo "+cap,"input_schema":{"type":"object"},"timeout_ms":20000,"kind":"sync","path":"/echo"}]}
    r=requests.post(B+'/api/v1/agents/register',headers={"Authorization":"Bearer "+A},json=d)
    print(r.status_code, r.text[:200]); out[name]=r.json()
json.dump(out,open('/tmp/breaker/agents.json','w'))
