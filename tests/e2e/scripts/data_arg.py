# The data depend on argv[1]; the model and everything else do not.
import sys, torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.randn(3, 16, 4, generator=torch.Generator().manual_seed(int(sys.argv[1])))
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data.reshape(48, 4)), batch_size=16)
for (x,) in loader:
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()
